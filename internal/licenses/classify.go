// Package licenses reads the licence files of the modules in a Go module
// graph, classifies them, and checks them against the licences Oasis may
// link: permissive and weak-copyleft open-source licences (Apache-2.0, MIT,
// BSD, ISC, MPL-2.0, ...). A module whose licence is not open source
// (BUSL, SSPL, Elastic, Commons Clause), strong copyleft (GPL, AGPL), or
// cannot be recognised fails the check, named with the reason.
package licenses

import (
	"regexp"
	"slices"
	"strings"
)

// Kind is a licence, by its SPDX identifier where it has one.
type Kind string

const (
	Apache2       Kind = "Apache-2.0"
	MIT           Kind = "MIT"
	BSD2          Kind = "BSD-2-Clause"
	BSD3          Kind = "BSD-3-Clause"
	ISC           Kind = "ISC"
	MPL2          Kind = "MPL-2.0"
	Unlicense     Kind = "Unlicense"
	Zlib          Kind = "Zlib"
	BSL1          Kind = "BSL-1.0"
	CC0           Kind = "CC0-1.0"
	BUSL          Kind = "BUSL-1.1"
	AGPL          Kind = "AGPL-3.0"
	GPL           Kind = "GPL"
	LGPL          Kind = "LGPL"
	SSPL          Kind = "SSPL-1.0"
	Elastic       Kind = "Elastic-2.0"
	CommonsClause Kind = "Commons-Clause"
)

// Allowed reports whether Oasis may link code under k.
func (k Kind) Allowed() bool {
	switch k {
	case Apache2, MIT, BSD2, BSD3, ISC, MPL2, Unlicense, Zlib, BSL1, CC0:
		return true
	}
	return false
}

// Forbidding reports whether k rules a module out even when another
// licence file of the module is allowed: source-available licences and
// restrictions that are not open source.
func (k Kind) Forbidding() bool {
	switch k {
	case BUSL, SSPL, Elastic, CommonsClause, AGPL:
		return true
	}
	return false
}

// rule recognises one licence by phrases of its text (lower case, single
// spaces, punctuation kept): all of must appear, none of unless.
type rule struct {
	kind   Kind
	all    []string
	unless []string
}

var rules = []rule{
	{kind: BUSL, all: []string{"business source license"}},
	{kind: SSPL, all: []string{"server side public license"}},
	{kind: Elastic, all: []string{"elastic license"}},
	{kind: CommonsClause, all: []string{"commons clause"}},
	// The GNU licences by their own titles: other licences name them
	// (MPL-2.0's "Secondary Licenses", the GPL's section 13) without being
	// them.
	{kind: AGPL, all: []string{"gnu affero general public license version 3, 19 november 2007"}},
	{kind: LGPL, all: []string{"gnu lesser general public license version 3, 29 june 2007"}},
	{kind: LGPL, all: []string{"gnu lesser general public license version 2.1, february 1999"}},
	{kind: LGPL, all: []string{"gnu library general public license version 2, june 1991"}},
	{kind: GPL, all: []string{"gnu general public license version 3, 29 june 2007"}},
	{kind: GPL, all: []string{"gnu general public license version 2, june 1991"}},
	{kind: MPL2, all: []string{"mozilla public license version 2.0"}},
	{kind: MPL2, all: []string{"mozilla public license, v. 2.0"}},
	{kind: Apache2, all: []string{"apache license", "version 2.0"}},
	{kind: Apache2, all: []string{"licensed under the apache license, version 2.0"}},
	{kind: MIT, all: []string{"permission is hereby granted, free of charge, to any person obtaining a copy"}},
	{kind: ISC, all: []string{"permission to use, copy, modify, and", "distribute this software for any purpose with or without fee is hereby granted"}},
	{kind: BSD3, all: []string{"redistribution and use in source and binary forms", "endorse or promote products"}},
	{kind: BSD2, all: []string{"redistribution and use in source and binary forms"}, unless: []string{"endorse or promote products"}},
	{kind: Unlicense, all: []string{"this is free and unencumbered software released into the public domain"}},
	{kind: Zlib, all: []string{"altered source versions must be plainly marked as such"}},
	{kind: BSL1, all: []string{"boost software license"}},
	{kind: CC0, all: []string{"creative commons", "cc0"}},
	{kind: CC0, all: []string{"creativecommons.org publicdomain zero 1.0"}},
}

var space = regexp.MustCompile(`[\s*#/]+`)

// normalize lowers text and folds runs of white space and comment markers
// to one space, so phrases match across line breaks.
func normalize(text string) string {
	return " " + strings.TrimSpace(space.ReplaceAllString(strings.ToLower(text), " ")) + " "
}

// Classify returns every licence recognised in text, sorted; nil when none
// is. A file may hold several (dual licences, bundled third-party notices).
func Classify(text string) []Kind {
	t := normalize(text)
	var kinds []Kind
	for _, r := range rules {
		if matches(t, r) && !slices.Contains(kinds, r.kind) {
			kinds = append(kinds, r.kind)
		}
	}
	slices.Sort(kinds)
	return kinds
}

func matches(t string, r rule) bool {
	for _, p := range r.all {
		if !strings.Contains(t, p) {
			return false
		}
	}
	for _, p := range r.unless {
		if strings.Contains(t, p) {
			return false
		}
	}
	return true
}
