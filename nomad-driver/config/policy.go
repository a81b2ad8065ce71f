package config

import (
	"errors"
	"maps"
	"slices"
	"strings"
)

// DefaultUser is the account engines run as when neither the task's `user`
// nor the plugin's default_user names one: an account that owns nothing on
// the node (not Nomad's data directory, not another task's files).
const DefaultUser = "nobody"

// Policy is what a client's plugin config lets a task run. The driver is
// raw_exec-class (no filesystem isolation), so the plugin config, not the
// job, decides which executable runs, with which loader variables, as whom.
// The zero value allows nothing extra and has no default user.
type Policy struct {
	// AllowTaskBinary lets a task's own `binary` replace the plugin's
	// binaries[engine]: the job then chooses the executable.
	AllowTaskBinary bool
	// AllowedEnv names variables extra_env may set although RefusedEnv
	// refuses them (exact names).
	AllowedEnv []string
	// DefaultUser runs tasks that set no `user`. Tasks may set `user = "root"`
	// only when it is "root".
	DefaultUser string
}

// DefaultPolicy is the policy of a plugin block that sets none of the
// options: the plugin's binaries, filtered extra_env, tasks as nobody.
func DefaultPolicy() Policy { return Policy{DefaultUser: DefaultUser} }

// Policy returns the plugin config's policy, defaults filled in.
func (p PluginConfig) Policy() Policy {
	pol := Policy{AllowTaskBinary: p.AllowTaskBinary, AllowedEnv: p.AllowedEnv, DefaultUser: p.DefaultUser}
	if pol.DefaultUser == "" {
		pol.DefaultUser = DefaultUser
	}
	return pol
}

// injectionEnv are variables that make a dynamic loader or an interpreter
// run code the job chose before the engine's own (beside every LD_* and
// DYLD_* variable): a job that sets them runs its own code as the task user
// whatever binary the plugin config names.
var injectionEnv = []string{
	"PATH",
	"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONEXECUTABLE",
	"PYTHONBREAKPOINT", "PYTHONWARNINGS", "PYTHONINSPECT", "PYTHONPLATLIBDIR", "PYTHONSAFEPATH",
	"NODE_OPTIONS", "NODE_PATH",
	"BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4",
	"PERL5OPT", "PERL5LIB", "PERLLIB", "RUBYOPT", "RUBYLIB",
	"GCONV_PATH", "HOSTALIASES", "LOCPATH", "NLSPATH",
}

// RefusedEnv reports why extra_env may not set name without the plugin's
// allowed_env naming it; "" when it may.
func RefusedEnv(name string) string {
	switch {
	case strings.HasPrefix(name, "LD_"), strings.HasPrefix(name, "DYLD_"):
		return "dynamic loader variables (LD_*) load code of the job's choosing into the engine"
	case name == "PATH":
		return "PATH chooses which executables the engine and its helpers run"
	case slices.Contains(injectionEnv, name):
		return "it makes an interpreter or shell load code of the job's choosing"
	}
	return ""
}

// CheckPolicy checks a task against the plugin's policy: its own binary,
// its extra_env, and its user (the task's `user`, "" when unset). Every
// refusal names the field and the plugin option that would allow it.
func (c TaskConfig) CheckPolicy(p Policy, user string) error {
	var errs []error
	if c.Binary != "" && !p.AllowTaskBinary {
		errs = append(errs, fieldErr("binary", "%q: a task may not choose the engine's executable; the client's plugin config does (binaries { %s = \"...\" }), or allows tasks to with allow_task_binary = true",
			c.Binary, c.Engine))
	}
	for _, k := range slices.Sorted(maps.Keys(c.ExtraEnv)) {
		if why := RefusedEnv(k); why != "" && !slices.Contains(p.AllowedEnv, k) {
			errs = append(errs, fieldErr("extra_env", "%s is refused: %s; the client's plugin config may allow it by name (allowed_env = [%q])", k, why, k))
		}
	}
	if isRoot(user) && !isRoot(p.DefaultUser) {
		errs = append(errs, fieldErr("user", "%q: tasks of driver llm run as root only where the client's plugin config sets default_user = \"root\" (this client's default: %q)", user, p.DefaultUser))
	}
	return errors.Join(errs...)
}

// isRoot reports whether a user name or id names the superuser.
func isRoot(user string) bool { return user == "root" || user == "0" }

// validateEnvNames checks allowed_env entries: variable names.
func validateEnvNames(names []string) error {
	var errs []error
	for _, n := range names {
		if n == "" || strings.ContainsAny(n, "= \t\n") {
			errs = append(errs, fieldErr("allowed_env", "invalid variable name %q", n))
		}
	}
	return errors.Join(errs...)
}

// validateUser checks default_user: a user name or numeric id.
func validateUser(u string) error {
	if strings.ContainsAny(u, ": \t\n") {
		return fieldErr("default_user", "%q is not a user name or id", u)
	}
	return nil
}
