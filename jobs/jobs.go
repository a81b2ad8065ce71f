// Package jobs embeds the Oasis system jobs (the router and kvcached
// jobspecs in this directory) so that tools such as terraform-provider-oasis
// submit exactly the files operators run with `nomad job run`.
package jobs

import _ "embed"

// Router is router.nomad.hcl: the oasis-router system job.
//
//go:embed router.nomad.hcl
var Router string

// Kvcached is kvcached.nomad.hcl: the oasis-kvcached system job.
//
//go:embed kvcached.nomad.hcl
var Kvcached string
