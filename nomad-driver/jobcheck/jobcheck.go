// Package jobcheck validates and renders the llm tasks of a parsed Nomad
// job before it is submitted. Nomad's servers never see a driver's schema
// (`nomad job validate` and `plan` accept any config block), so this is
// the pre-flight that names the bad field without running anything: the
// same validation and rendering StartTask performs, with the group's port
// labels and the task's GPU device count standing in for the allocation.
package jobcheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	nomadapi "github.com/hashicorp/nomad/api"

	"github.com/oasis-llm/oasis/nomad-driver/config"
	"github.com/oasis-llm/oasis/nomad-driver/render"
	"github.com/oasis-llm/oasis/nomad-driver/tiers"
)

// Result is the outcome for one llm task.
type Result struct {
	Group, Task string
	// Plan is the rendering with placeholder port values (nil on error).
	Plan *render.Plan
	Err  error
}

func (r Result) String() string {
	where := fmt.Sprintf("group %q task %q", r.Group, r.Task)
	if r.Err != nil {
		return where + ": " + strings.ReplaceAll(r.Err.Error(), "\n", "\n  ")
	}
	if r.Plan.NoProcess {
		return where + ": ok (no process; watches " + r.Plan.HealthURL + ")"
	}
	return where + ": ok: " + strings.Join(r.Plan.Argv, " ")
}

// Check returns one result per task with driver "llm", checked against the
// policy of a plugin block that sets no policy options (config.DefaultPolicy):
// no task binary, no loader variables in extra_env, no root tasks.
func Check(job *nomadapi.Job) []Result { return CheckPolicy(job, config.DefaultPolicy()) }

// CheckPolicy is Check against the policy of the clients the job runs on.
// Tasks with a kv_offload_tier fail: use CheckWith and a tier source.
func CheckPolicy(job *nomadapi.Job, policy config.Policy) []Result {
	return CheckWith(context.Background(), job, Options{Policy: policy})
}

// Options are what CheckWith checks a job against.
type Options struct {
	// Policy is the clients' plugin policy.
	Policy config.Policy
	// Tiers reads the declarations of the tiers tasks name in
	// kv_offload_tier (nil: such tasks fail, naming the field).
	Tiers tiers.Source
}

// CheckWith is Check against the clients' policy and the cluster's tiers.
func CheckWith(ctx context.Context, job *nomadapi.Job, opts Options) []Result {
	policy := opts.Policy
	var out []Result
	for _, g := range job.TaskGroups {
		ports := map[string]render.Port{}
		next := 20000 // placeholder values: real ones come from the allocation
		namespaced := false
		for _, n := range g.Networks {
			// bridge and cni/* give the group its own namespace (Nomad's
			// "group" isolation); host and none do not.
			namespaced = namespaced || n.Mode == "bridge" || strings.HasPrefix(n.Mode, "cni/")
			for _, p := range append(append([]nomadapi.Port(nil), n.ReservedPorts...), n.DynamicPorts...) {
				v := p.Value
				if v == 0 {
					next++
					v = next
				}
				ports[p.Label] = render.Port{HostIP: "127.0.0.1", Value: v, To: p.To}
			}
		}
		for _, t := range g.Tasks {
			if t.Driver != "llm" {
				continue
			}
			r := Result{Group: deref(g.Name), Task: t.Name}
			tc, err := decode(t.Config)
			if err != nil {
				r.Err = err
				out = append(out, r)
				continue
			}
			in := render.Input{
				Config: tc, Ports: ports, GPUs: gpus(t.Resources), Namespaced: namespaced,
				LocalDir: "${NOMAD_TASK_DIR}", SecretsDir: "${NOMAD_SECRETS_DIR}", Policy: policy, User: t.User,
			}
			if in.Tier, r.Err = readTier(ctx, opts.Tiers, t, tc.KVOffloadTier); r.Err != nil {
				out = append(out, r)
				continue
			}
			r.Plan, r.Err = render.Render(in)
			if r.Err == nil {
				r.Err = checkMeta(job, g, t, r.Plan.Config)
			}
			out = append(out, r)
		}
	}
	return out
}

// readTier reads the task's kv_offload_tier ("" reads nothing) and checks
// that the task lets the driver read it at start: with its workload
// identity's token in its environment or secrets directory.
func readTier(ctx context.Context, src tiers.Source, t *nomadapi.Task, name string) (*config.Tier, error) {
	if name == "" {
		return nil, nil
	}
	if !exposesIdentity(t) {
		return nil, &config.FieldError{Field: "kv_offload_tier", Msg: "the driver reads the tier at start with the task's workload identity, which the task does not expose: add identity { file = true } to the task"}
	}
	if src == nil {
		return nil, &TierUncheckedError{Tier: name}
	}
	return src.Tier(ctx, name)
}

// TierUncheckedError is the result of a task whose kv_offload_tier could
// not be read: CheckWith was given no tier source.
type TierUncheckedError struct{ Tier string }

func (e *TierUncheckedError) Error() string {
	return fmt.Sprintf("kv_offload_tier: tier %q cannot be checked here: no tier source (nomad-driver-llm validate reads tiers from Nomad variables)", e.Tier)
}

// exposesIdentity reports whether the task's default workload identity
// reaches the driver: identity { env = true } or { file = true }.
func exposesIdentity(t *nomadapi.Task) bool {
	ids := append([]*nomadapi.WorkloadIdentity{t.Identity}, t.Identities...)
	for _, id := range ids {
		if id != nil && (id.Name == "" || id.Name == "default") && (id.Env || id.File) && id.Filepath == "" {
			return true
		}
	}
	return false
}

// checkMeta compares the oasis_* meta the router reads with the task's
// rendered config: the job, group and task meta (the task's NOMAD_META_*,
// which the driver checks again at start), and the meta of every service
// of the group that is not bound to another task and of the task's own
// services. A service value "${NOMAD_META_<key>}" is resolved from the
// job, group and task meta, as Nomad does; other interpolations are left
// to the client.
func checkMeta(job *nomadapi.Job, g *nomadapi.TaskGroup, t *nomadapi.Task, c config.TaskConfig) error {
	merged := map[string]string{}
	maps.Copy(merged, job.Meta)
	maps.Copy(merged, g.Meta)
	maps.Copy(merged, t.Meta)
	errs := []error{c.CheckServiceMeta("job/group/task", merged)}
	services := slices.Clone(t.Services)
	for _, s := range g.Services {
		if s.TaskName == "" || s.TaskName == t.Name {
			services = append(services, s)
		}
	}
	for _, s := range services {
		meta := make(map[string]string, len(s.Meta))
		for k, v := range s.Meta {
			if ref, ok := strings.CutPrefix(v, "${NOMAD_META_"); ok && strings.HasSuffix(ref, "}") {
				if mv, ok := merged[strings.TrimSuffix(ref, "}")]; ok {
					v = mv
				}
			}
			meta[k] = v
		}
		errs = append(errs, c.CheckServiceMeta(fmt.Sprintf("service %q", s.Name), meta))
	}
	return errors.Join(errs...)
}

// decode maps a parsed config block onto the task config; unknown fields
// and wrong types are errors naming the field, as the client's schema check.
// encoding/json's unknown-field error has no type to check for, so the
// block's keys are checked against the config's fields here. The decoder
// reads the keys in sorted order and reports the first bad one; so does
// decode, by decoding the keys before the first unknown one on their own.
func decode(raw map[string]interface{}) (config.TaskConfig, error) {
	keys := slices.Sorted(maps.Keys(raw))
	for i, k := range keys {
		if taskFields[k] {
			continue
		}
		before := make(map[string]interface{}, i)
		for _, k := range keys[:i] {
			before[k] = raw[k]
		}
		if tc, err := decodeKnown(before); err != nil {
			return tc, err
		}
		return config.TaskConfig{}, &config.FieldError{Field: k, Msg: "unknown field (see nomad-driver/README.md for the task config reference)"}
	}
	return decodeKnown(raw)
}

// decodeKnown is decode for a block whose keys are all fields.
func decodeKnown(raw map[string]interface{}) (config.TaskConfig, error) {
	var tc config.TaskConfig
	raw, err := unwrapBlocks(raw)
	if err != nil {
		return tc, err
	}
	b, err := json.Marshal(raw)
	if err != nil {
		return tc, fmt.Errorf("encoding config block: %w", err)
	}
	if err := json.Unmarshal(b, &tc); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return tc, &config.FieldError{Field: te.Field, Msg: fmt.Sprintf("wrong type: got %s, want %s", te.Value, te.Type)}
		}
		return tc, fmt.Errorf("decoding config block: %w", err)
	}
	return tc, nil
}

// blockFields are the task config's maps that the client's schema declares
// as blocks of attributes (config.TaskSpec): Nomad's HCL job parser turns
// `extra_env = { ... }` (or `extra_env { ... }`) into a list of one map, a
// job submitted as JSON may carry the map itself, and the client decodes
// both; more than one block is the client's "Duplicate extra_env block".
var blockFields = []string{"extra_env", "llm_api_options"}

// unwrapBlocks returns raw with each block field's list of one map replaced
// by the map (raw itself is not modified).
func unwrapBlocks(raw map[string]interface{}) (map[string]interface{}, error) {
	var out map[string]interface{}
	for _, f := range blockFields {
		v, ok := raw[f]
		if !ok {
			continue
		}
		var blocks []interface{}
		switch l := v.(type) {
		case []interface{}:
			blocks = l
		case []map[string]interface{}:
			for _, m := range l {
				blocks = append(blocks, m)
			}
		case []map[string]string:
			for _, m := range l {
				blocks = append(blocks, m)
			}
		default:
			continue // a map, or a wrong type the decoder names
		}
		if len(blocks) > 1 {
			return nil, &config.FieldError{Field: f, Msg: fmt.Sprintf("one map expected, got %d (write %s = { NAME = \"value\", ... } once)", len(blocks), f)}
		}
		if out == nil {
			out = maps.Clone(raw)
		}
		if len(blocks) == 0 {
			delete(out, f)
			continue
		}
		out[f] = blocks[0]
	}
	if out == nil {
		return raw, nil
	}
	return out, nil
}

// taskFields holds the task config's JSON field names. Keys must match them
// exactly: encoding/json would match "Engine" to engine, but the client's
// hclspec refuses it, and the pre-flight must not pass a job that fails there.
var taskFields = func() map[string]bool {
	t := reflect.TypeFor[config.TaskConfig]()
	names := make(map[string]bool, t.NumField())
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" {
			name = f.Name
		}
		names[name] = true
	}
	return names
}()

// gpus stands in for the device plugin's reservation: one id per GPU the
// task requests (device "gpu", "nvidia/gpu" or "nvidia/gpu/<model>").
func gpus(res *nomadapi.Resources) []string {
	if res == nil {
		return nil
	}
	var ids []string
	for _, d := range res.Devices {
		name := d.Name
		if name != "gpu" && name != "nvidia/gpu" && !strings.HasPrefix(name, "nvidia/gpu/") {
			continue
		}
		n := uint64(1)
		if d.Count != nil {
			n = *d.Count
		}
		for i := uint64(0); i < n; i++ {
			ids = append(ids, fmt.Sprintf("GPU-%d", len(ids)))
		}
	}
	return ids
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
