package policy

import (
	"testing"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/shoenig/test/must"
)

func TestNewWatcher(t *testing.T) {
	client, err := consulapi.NewClient(consulapi.DefaultConfig())
	must.NoError(t, err)
	terms := registry(t)

	for _, cfg := range []WatcherConfig{
		{Key: "k", Terms: terms},
		{Client: client, Terms: terms},
		{Client: client, Key: "k"},
	} {
		_, err := NewWatcher(cfg)
		must.ErrorContains(t, err, "creating policy watcher")
	}

	// Logger and Metrics are optional; the default document serves until
	// the first read.
	w, err := NewWatcher(WatcherConfig{Client: client, Key: "k", Terms: terms})
	must.NoError(t, err)
	must.Eq(t, Default(), w.Current())
	must.Eq(t, 0, w.AppliedIndex())
}
