package licenses

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

const (
	apacheHeader = `
                                 Apache License
                           Version 2.0, January 2004`
	mitText = `Copyright (c) 2020 Someone

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal`
	bsd3Text = `Redistribution and use in source and binary forms, with or without
modification, are permitted provided that the following conditions are met:
   * Neither the name of Google Inc. nor the names of its
contributors may be used to endorse or promote products derived from`
	bsd2Text = `Redistribution and use in source and binary forms, with or without
modification, are permitted provided that the following conditions are met:`
	mplText = `Mozilla Public License Version 2.0
==================================
1.12. "Secondary License"
    means either the GNU General Public License, Version 2.0, the GNU Lesser
    General Public License, Version 2.1, the GNU Affero General Public
    License, Version 3.0, or any later versions of those licenses.`
	buslText = `License text copyright (c) 2020 MariaDB Corporation Ab, All Rights Reserved.
"Business Source License" is a trademark of MariaDB Corporation Ab.

Parameters

Licensor:             HashiCorp, Inc.
Licensed Work:        Nomad Version 1.7.0 or later.
Change License:       Mozilla Public License, version 2.0`
	agplText = `                    GNU AFFERO GENERAL PUBLIC LICENSE
                       Version 3, 19 November 2007

 Copyright (C) 2007 Free Software Foundation, Inc. <https://fsf.org/>
 Everyone is permitted to copy and distribute verbatim copies
 of this license document, but changing it is not allowed.`
	gpl3Text = `                    GNU GENERAL PUBLIC LICENSE
                       Version 3, 29 June 2007

 Everyone is permitted to copy and distribute verbatim copies
 of this license document, but changing it is not allowed.
  13. Use with the GNU Affero General Public License.`
	iscText = `Permission to use, copy, modify, and/or distribute this software for any
purpose with or without fee is hereby granted, provided that the above`
	cc0Text = `To the extent possible under law, X has waived all copyright.
https://creativecommons.org/publicdomain/zero/1.0/legalcode`
)

func TestClassify(t *testing.T) {
	cases := []struct {
		name string
		text string
		want []Kind
	}{
		{"apache", apacheHeader, []Kind{Apache2}},
		{"mit", mitText, []Kind{MIT}},
		{"bsd3", bsd3Text, []Kind{BSD3}},
		{"bsd2", bsd2Text, []Kind{BSD2}},
		{"mpl names the GNU licences without being one", mplText, []Kind{MPL2}},
		{"busl", buslText, []Kind{BUSL}},
		{"agpl", agplText, []Kind{AGPL}},
		{"gpl3 mentions the AGPL", gpl3Text, []Kind{GPL}},
		{"isc", iscText, []Kind{ISC}},
		{"cc0 waiver", cc0Text, []Kind{CC0}},
		{"dual mit and apache", mitText + "\n" + apacheHeader, []Kind{Apache2, MIT}},
		{"unknown", "All rights reserved.", nil},
		{"empty", "", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			must.Eq(t, tc.want, Classify(tc.text))
		})
	}
}

func TestVerdict(t *testing.T) {
	cases := []struct {
		name    string
		files   map[string]string
		linked  bool
		problem string // substring; "" passes
	}{
		{"allowed", map[string]string{"LICENSE": mitText}, true, ""},
		{"busl refused even beside an allowed licence", map[string]string{"LICENSE": buslText, "LICENSE-MPL": mplText}, true, "BUSL-1.1"},
		{"busl refused when not linked", map[string]string{"LICENSE": buslText}, false, "BUSL-1.1"},
		{"agpl refused", map[string]string{"COPYING": agplText}, true, "AGPL-3.0"},
		{"gpl alone refused when linked", map[string]string{"COPYING": gpl3Text}, true, "GPL only"},
		{"gpl beside mit is a dual licence", map[string]string{"LICENSE-MIT": mitText, "COPYING": gpl3Text}, true, ""},
		{"unknown refused when linked", map[string]string{"LICENSE": "All rights reserved."}, true, "not recognised in LICENSE"},
		{"no file refused when linked", nil, true, "no licence file"},
		{"no file passes when only go.mod is in the graph", nil, false, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := Module{Path: "example.com/m", Version: "v1.0.0", Files: tc.files, Linked: tc.linked}
			m.verdict()
			if tc.problem == "" {
				must.EqOp(t, "", m.Problem)
			} else {
				must.StrContains(t, m.Problem, tc.problem)
			}
		})
	}
}

// TestDeniedModulePathFailsWhateverItsLicence: the Nomad module fails
// even at v1.6.3, whose LICENSE is MPL-2.0; its api submodule passes.
func TestDeniedModulePathFailsWhateverItsLicence(t *testing.T) {
	cases := []struct {
		path    string
		problem string
	}{
		{"github.com/hashicorp/nomad", "not to use: under the Business Source License"},
		{"github.com/hashicorp/consul/troubleshoot", "not to use"},
		{"go.k6.io/k6", "not to use: under the AGPL"},
		{"github.com/hashicorp/nomad/api", ""},
		{"github.com/hashicorp/consul/api", ""},
	}
	for _, tc := range cases {
		t.Run(tc.path, func(t *testing.T) {
			m := Module{Path: tc.path, Version: "v1.6.3", Files: map[string]string{"LICENSE": mplText}, Linked: true}
			m.verdict()
			m.deny()
			if tc.problem == "" {
				must.EqOp(t, "", m.Problem)
			} else {
				must.StrContains(t, m.Problem, tc.problem)
			}
		})
	}
}

func TestIsLicenseFile(t *testing.T) {
	for _, n := range []string{"LICENSE", "LICENSE.txt", "license.md", "LICENCE", "COPYING", "LICENSE-APACHE", "UNLICENSE"} {
		must.True(t, isLicenseFile(n), must.Sprint(n))
	}
	for _, n := range []string{"README.md", "NOTICE", "go.mod", "licenses.go"} {
		must.False(t, isLicenseFile(n), must.Sprint(n))
	}
}

// writeModule writes a module at dir with a package p and the given files.
func writeModule(t *testing.T, dir, path string, files map[string]string) {
	t.Helper()
	must.NoError(t, os.MkdirAll(filepath.Join(dir, "p"), 0o755))
	must.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module "+path+"\n\ngo 1.22\n"), 0o644))
	must.NoError(t, os.WriteFile(filepath.Join(dir, "p", "p.go"), []byte("package p\n\nconst X = 1\n"), 0o644))
	for name, text := range files {
		must.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644))
	}
}

// plantedGraph writes a main module that links example.com/dep (its licence
// depLicense) and whose graph holds example.com/modonly, required but never
// imported (licence modonlyLicense, "" for none).
func plantedGraph(t *testing.T, depLicense, modonlyLicense string) string {
	t.Helper()
	root := t.TempDir()
	main := filepath.Join(root, "app")
	must.NoError(t, os.MkdirAll(main, 0o755))
	must.NoError(t, os.WriteFile(filepath.Join(main, "go.mod"), []byte(`module example.com/app

go 1.22

require (
	example.com/dep v0.0.0
	example.com/modonly v0.0.0
)

replace example.com/dep => ../dep

replace example.com/modonly => ../modonly
`), 0o644))
	must.NoError(t, os.WriteFile(filepath.Join(main, "main.go"), []byte("package main\n\nimport \"example.com/dep/p\"\n\nfunc main() { _ = p.X }\n"), 0o644))
	must.NoError(t, os.WriteFile(filepath.Join(main, "LICENSE"), []byte(apacheHeader), 0o644))
	writeModule(t, filepath.Join(root, "dep"), "example.com/dep", map[string]string{"LICENSE": depLicense})
	only := map[string]string{}
	if modonlyLicense != "" {
		only["LICENSE"] = modonlyLicense
	}
	writeModule(t, filepath.Join(root, "modonly"), "example.com/modonly", only)
	return main
}

func offline(t *testing.T) {
	t.Setenv("GOFLAGS", "-mod=mod")
	t.Setenv("GOPROXY", "off")
	t.Setenv("GOWORK", "off")
}

// TestCheckRefusesPlantedBUSL plants a BUSL-licensed dependency in a real
// module graph: the check fails naming it.
func TestCheckRefusesPlantedBUSL(t *testing.T) {
	offline(t)
	dir := plantedGraph(t, buslText, "")
	mods, err := Check(context.Background(), dir)
	must.ErrorIs(t, err, ErrRefused)
	var refused *RefusedError
	must.True(t, errors.As(err, &refused))
	must.SliceLen(t, 1, refused.Modules)
	must.EqOp(t, "example.com/dep", refused.Modules[0].Path)
	must.StrContains(t, err.Error(), "example.com/dep@v0.0.0: licensed under BUSL-1.1")
	must.SliceLen(t, 3, mods)
}

// TestCheckPassesOpenSourceGraph: the same graph with an MIT dependency
// passes; the required-but-unused module without a licence file is not
// linked, so it does not fail the check.
func TestCheckPassesOpenSourceGraph(t *testing.T) {
	offline(t)
	dir := plantedGraph(t, mitText, "")
	mods, err := Check(context.Background(), dir)
	must.NoError(t, err)
	i := slices.IndexFunc(mods, func(m Module) bool { return m.Path == "example.com/modonly" })
	must.NonNegative(t, i)
	must.False(t, mods[i].Linked)
	j := slices.IndexFunc(mods, func(m Module) bool { return m.Path == "example.com/dep" })
	must.True(t, mods[j].Linked)
	must.Eq(t, []Kind{MIT}, mods[j].Kinds)
}

// TestCheckRefusesForbiddingLicenceOutsideTheBuild: a source-available
// licence fails even on a module that only its go.mod brings into the graph.
func TestCheckRefusesForbiddingLicenceOutsideTheBuild(t *testing.T) {
	offline(t)
	dir := plantedGraph(t, mitText, buslText)
	_, err := Check(context.Background(), dir)
	must.ErrorIs(t, err, ErrRefused)
	must.StrContains(t, err.Error(), "example.com/modonly@v0.0.0: licensed under BUSL-1.1")
}

func TestWriteNotice(t *testing.T) {
	mods := []Module{
		{Path: "b.example/x", Version: "v1.0.0", Kinds: []Kind{MIT}, Files: map[string]string{"LICENSE": mitText}},
		{Path: "a.example/y", Version: "v2.0.0", Kinds: []Kind{Apache2}, Files: map[string]string{"LICENSE": apacheHeader}},
		{Path: "c.example/z", Version: "v3.0.0", Kinds: []Kind{BSD2}, Files: map[string]string{"LICENSE": bsd2Text}},
	}
	var b strings.Builder
	must.NoError(t, WriteNotice(&b, mods, func(m Module) bool { return m.Path != "c.example/z" }))
	out := b.String()
	must.StrContains(t, out, "(2 Go modules)")
	must.True(t, strings.Index(out, "a.example/y") < strings.Index(out, "b.example/x"))
	must.StrContains(t, out, "Permission is hereby granted")
	must.StrNotContains(t, out, "c.example/z")
}
