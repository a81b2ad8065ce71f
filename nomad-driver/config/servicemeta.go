package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Service meta keys the router reads about an engine (router/discovery). A
// value that contradicts the task config makes the router hash prompts with
// the wrong block size, or route a model or role to an engine that does not
// serve it: prefix routing degrades without an error anywhere.
const (
	MetaModel     = "oasis_model"
	MetaEngine    = "oasis_engine"
	MetaRole      = "oasis_role"
	MetaBlockSize = "oasis_block_size"
)

// MetaKeys lists the meta keys CheckServiceMeta compares, in order.
var MetaKeys = []string{MetaModel, MetaEngine, MetaRole, MetaBlockSize}

// MetaError is a service meta value that contradicts the task config.
type MetaError struct {
	// Where names the meta's source, e.g. `service "oasis-engine"` or
	// `job/group/task meta (NOMAD_META_oasis_model)`.
	Where string
	// Key is the meta key (oasis_model, ...), Field the task config field
	// it must agree with.
	Key, Field string
	// Got is the meta value, Want what the task config renders.
	Got, Want string
}

func (e *MetaError) Error() string {
	return fmt.Sprintf("%s meta %s: %q contradicts the task's %s (%q); the router would read the wrong value: set it to %q",
		e.Where, e.Key, e.Got, e.Field, e.Want, e.Want)
}

// ExpectedMeta returns what each key of MetaKeys must say for the
// normalized config c, and the task field it comes from. Engines without a
// KV block size expect "" for oasis_block_size (the router then assumes its
// default and finds no prefix events to match anyway).
func (c TaskConfig) ExpectedMeta() map[string][2]string {
	bs := ""
	if HasBlockSize(c.Engine) {
		bs = strconv.Itoa(c.BlockSize)
	}
	return map[string][2]string{
		MetaModel:     {c.ServedModelName, "served_model_name"},
		MetaEngine:    {c.Engine, "engine"},
		MetaRole:      {c.Role, "role"},
		MetaBlockSize: {bs, "block_size"},
	}
}

// CheckServiceMeta compares the oasis_* keys present in meta with the
// normalized config c and returns a *MetaError for each contradiction.
// Absent keys are not checked; values still holding an interpolation
// ("${...}") are skipped, since only the client knows them. An empty
// oasis_block_size on an engine with a block size means the router's
// default, DefaultBlockSize.
func (c TaskConfig) CheckServiceMeta(where string, meta map[string]string) error {
	want := c.ExpectedMeta()
	var errs []error
	for _, k := range MetaKeys {
		got, ok := meta[k]
		if !ok || strings.Contains(got, "${") {
			continue
		}
		w := want[k]
		norm := strings.TrimSpace(got)
		if k == MetaBlockSize && norm == "" && w[0] != "" {
			norm = strconv.Itoa(DefaultBlockSize)
		}
		if norm != w[0] {
			errs = append(errs, &MetaError{Where: where, Key: k, Field: w[1], Got: got, Want: w[0]})
		}
	}
	return errors.Join(errs...)
}

// EnvMeta returns the oasis_* keys of MetaKeys found in a task's
// environment as Nomad sets it from job, group and task meta
// (NOMAD_META_<key>, in the key's own case and upper-cased).
func EnvMeta(env map[string]string) map[string]string {
	out := map[string]string{}
	for _, k := range MetaKeys {
		for _, name := range []string{"NOMAD_META_" + k, "NOMAD_META_" + strings.ToUpper(k)} {
			if v, ok := env[name]; ok {
				out[k] = v
				break
			}
		}
	}
	return out
}
