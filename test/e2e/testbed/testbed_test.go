package testbed

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/shoenig/test/must"
)

func TestExitedErrorNamesAPortRace(t *testing.T) {
	cases := []struct {
		name, log string
		portTaken bool
	}{
		{"bind failed", `[ERROR] agent: Error starting agent: error="listen tcp 127.0.0.1:42201: bind: address already in use"`, true},
		{"other failure", `[ERROR] agent: Error starting agent: error="invalid config"`, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := &Stack{Dir: t.TempDir()}
			must.NoError(t, os.WriteFile(filepath.Join(s.Dir, "consul.log"), []byte(tc.log+"\n"), 0o644))
			err := s.exitedError("consul", "consul.log")
			var perm permanentError
			must.True(t, errors.As(err, &perm))
			must.Eq(t, tc.portTaken, errors.Is(err, errPortTaken))
		})
	}
}

func TestOnFreshPortsRetriesOnlyAPortRace(t *testing.T) {
	cases := []struct {
		name         string
		errs         []error
		wantStarts   int
		wantStops    int
		wantErrIsRac bool
	}{
		{"first start works", []error{nil}, 1, 0, false},
		{"race then success", []error{errPortTaken, nil}, 2, 1, false},
		{"other error is not retried", []error{errors.New("invalid config")}, 1, 0, false},
		{"three races give up", []error{errPortTaken, errPortTaken, errPortTaken, nil}, 3, 2, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := &Stack{logf: t.Logf}
			starts, stops := 0, 0
			err := s.onFreshPorts("consul", func() error {
				starts++
				return tc.errs[starts-1]
			}, func() error {
				stops++
				return nil
			})
			must.Eq(t, tc.wantStarts, starts)
			must.Eq(t, tc.wantStops, stops)
			must.Eq(t, tc.wantErrIsRac, errors.Is(err, errPortTaken))
			if tc.errs[starts-1] == nil {
				must.NoError(t, err)
			}
		})
	}
}
