package recipes

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

// minDrainKillTimeout is the least kill_timeout an engine recipe gives the
// llm driver's drain: oasis-sim's; real engines get more (their READMEs).
const minDrainKillTimeout = 30 * time.Second

// TestRecipesDrainOnStop checks what graceful drain needs (issue #37) in
// every recipe: each group running an llm engine leaves routing before its
// task is stopped (shutdown_delay) and gives the driver's drain a bound
// (kill_timeout); hosted endpoints, with nothing to drain, need only the
// shutdown_delay.
func TestRecipesDrainOnStop(t *testing.T) {
	root, err := testbed.RepoRoot()
	must.NoError(t, err)
	for _, f := range jobFiles(t) {
		if !strings.HasPrefix(f.rel, "recipes/") {
			continue
		}
		t.Run(f.rel, func(t *testing.T) {
			job, err := stack.ParseJobFile(filepath.Join(root, f.rel), stack.MeshVariables())
			must.NoError(t, err)
			for _, tg := range job.TaskGroups {
				for _, task := range tg.Tasks {
					if task.Driver != "llm" {
						continue
					}
					must.NotNil(t, tg.ShutdownDelay, must.Sprintf("group %s: no shutdown_delay (graceful drain, issue #37: the recipes' README section Stopping, updating, draining)", *tg.Name))
					must.Positive(t, *tg.ShutdownDelay, must.Sprintf("group %s: shutdown_delay", *tg.Name))
					if task.Config["engine"] == "openai_compat" {
						continue
					}
					must.NotNil(t, task.KillTimeout, must.Sprintf("group %s task %s: no kill_timeout", *tg.Name, task.Name))
					must.GreaterEq(t, minDrainKillTimeout, *task.KillTimeout,
						must.Sprintf("group %s task %s: kill_timeout bounds the drain", *tg.Name, task.Name))
				}
			}
		})
	}
}
