package config

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

// TestREADMEMatrix keeps the README's support table equal to the matrix the code enforces.
func TestREADMEMatrix(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	must.NoError(t, err)
	must.StrContains(t, string(readme), Matrix())
}

func TestNormalizeDefaults(t *testing.T) {
	c := TaskConfig{Engine: EngineVLLM, Model: "m", KVOffload: OffloadKVCached}.Normalize()
	must.EqOp(t, RoleBoth, c.Role)
	must.EqOp(t, "m", c.ServedModelName)
	must.EqOp(t, 1, c.TensorParallelSize)
	must.EqOp(t, DefaultBlockSize, c.BlockSize)
	must.EqOp(t, DefaultKVCachedAddress, c.KVCachedAddress)
	must.True(t, c.EventsOn())

	c = TaskConfig{Engine: EngineLlamaCpp, Model: "m"}.Normalize()
	must.EqOp(t, 0, c.BlockSize)
	must.False(t, c.EventsOn())
	must.EqOp(t, OffloadNone, c.KVOffload)
}

// Matrix renders the support table as Markdown for the README.
func Matrix() string {
	var b strings.Builder
	b.WriteString("| engine | " + strings.Join(Offloads, " | ") + " |\n|---|" + strings.Repeat("---|", len(Offloads)) + "\n")
	for _, e := range Engines {
		b.WriteString("| " + e + " |")
		for _, o := range Offloads {
			roles := matrix[e][o].roles
			cell := "—"
			if len(roles) == 3 {
				cell = "all"
			} else if len(roles) > 0 {
				cell = strings.Join(roles, ", ")
			}
			fmt.Fprintf(&b, " %s |", cell)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// A disaggregated sim needs one protocol's port: nixl_side_channel_port (vLLM) or
// bootstrap_port (SGLang), on either role.
func TestSimDisaggPorts(t *testing.T) {
	base := TaskConfig{Engine: EngineSim, Model: "m", Port: "http", KVEvents: new(bool)}
	for _, tc := range []struct {
		role, nixl, bootstrap, err string
	}{
		{RolePrefill, "nixl", "", ""},
		{RoleDecode, "", "bootstrap", ""},
		{RolePrefill, "", "bootstrap", ""},
		{RoleDecode, "", "", "nixl_side_channel_port: role \"decode\" on engine sim needs a port label"},
		{RolePrefill, "nixl", "bootstrap", "bootstrap_port: engine sim serves one protocol"},
		{RoleBoth, "", "bootstrap", "bootstrap_port: only used by sglang with role prefill, or by sim"},
	} {
		c := base
		c.Role, c.NIXLSideChannelPort, c.BootstrapPort = tc.role, tc.nixl, tc.bootstrap
		err := c.Normalize().Validate()
		if tc.err == "" {
			must.NoError(t, err, must.Sprintf("%+v", tc))
			must.Eq(t, tc.bootstrap != "", c.SGLangStyleSim())
		} else {
			must.ErrorContains(t, err, tc.err)
		}
	}
}
