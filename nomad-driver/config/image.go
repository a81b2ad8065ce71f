package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/oasis-llm/oasis/internal/nomadplugin/hclspec"
)

// Container runtimes the plugin's container block accepts.
const (
	RuntimePodman = "podman"
	// DefaultContainerSocket is Podman's rootful API socket
	// (podman.socket, or `podman system service`).
	DefaultContainerSocket = "unix:///run/podman/podman.sock"
)

// ContainerRuntimes lists the accepted container.runtime values.
var ContainerRuntimes = []string{RuntimePodman}

// ContainerSpec is the schema of the plugin config's container block:
//
//	container {
//	  runtime = "podman"
//	  socket  = "unix:///run/podman/podman.sock"
//	}
var ContainerSpec = hclspec.NewBlock("container", false, hclspec.NewObject(map[string]*hclspec.Spec{
	"runtime": hclspec.NewDefault(hclspec.NewAttr("runtime", "string", false), hclspec.NewLiteral(`"podman"`)),
	"socket":  hclspec.NewDefault(hclspec.NewAttr("socket", "string", false), hclspec.NewLiteral(`"`+DefaultContainerSocket+`"`)),
}))

// ContainerConfig is the decoded container block. The zero value (no
// block) means Podman at DefaultContainerSocket.
type ContainerConfig struct {
	Runtime string `codec:"runtime" json:"runtime,omitempty"`
	Socket  string `codec:"socket" json:"socket,omitempty"`
}

// WithDefaults fills in the runtime and socket when unset.
func (c ContainerConfig) WithDefaults() ContainerConfig {
	if c.Runtime == "" {
		c.Runtime = RuntimePodman
	}
	if c.Socket == "" {
		c.Socket = DefaultContainerSocket
	}
	return c
}

// SocketPath is the filesystem path of the runtime's unix socket.
func (c ContainerConfig) SocketPath() string {
	return strings.TrimPrefix(c.WithDefaults().Socket, "unix://")
}

// Validate checks the runtime name and the socket address.
func (c ContainerConfig) Validate() error {
	c = c.WithDefaults()
	var errs []error
	if c.Runtime != RuntimePodman {
		errs = append(errs, fieldErr("container.runtime", "unknown runtime %q; allowed: %s", c.Runtime, strings.Join(ContainerRuntimes, ", ")))
	}
	if !strings.HasPrefix(c.Socket, "unix:///") {
		errs = append(errs, fieldErr("container.socket", "%q is not a unix socket address (e.g. %q)", c.Socket, DefaultContainerSocket))
	}
	return errors.Join(errs...)
}

// AuthSpec is the schema of a task's registry credentials, for images from
// a private registry. Source them from a Nomad variable with a template
// (env = true) and interpolate them: auth { username = "${REGISTRY_USER}" ... }.
var AuthSpec = hclspec.NewBlock("auth", false, hclspec.NewObject(map[string]*hclspec.Spec{
	"username": hclspec.NewAttr("username", "string", false),
	"password": hclspec.NewAttr("password", "string", false),
}))

// ImageAuth holds registry credentials for pulling a task's image.
type ImageAuth struct {
	Username string `codec:"username" json:"username,omitempty"`
	Password string `codec:"password" json:"password,omitempty"`
}

// UnmarshalJSON accepts the block as an object or as the one-element list
// Nomad's job parser makes of a block (nomad-driver-llm validate).
func (a *ImageAuth) UnmarshalJSON(b []byte) error {
	type plain ImageAuth
	if t := bytes.TrimSpace(b); len(t) > 0 && t[0] == '[' {
		var list []plain
		if err := json.Unmarshal(t, &list); err != nil {
			return err
		}
		if len(list) > 1 {
			return fieldErr("auth", "only one auth block is allowed")
		}
		if len(list) == 1 {
			*a = ImageAuth(list[0])
		}
		return nil
	}
	return json.Unmarshal(b, (*plain)(a))
}

// ImageRef is a parsed image reference: [domain[:port]/]path[:tag][@digest].
type ImageRef struct {
	Domain string // "" when the reference names none (the runtime's default registries)
	Path   string
	Tag    string
	Digest string // "sha256:<64 hex>" when pinned
}

// Reference patterns, after github.com/distribution/reference's grammar.
var (
	domainComponent = `(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])`
	domainRe        = regexp.MustCompile(`^(?:` + domainComponent + `(?:\.` + domainComponent + `)*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?$`)
	pathComponentRe = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*$`)
	tagRe           = regexp.MustCompile(`^[\w][\w.-]{0,127}$`)
	digestRe        = regexp.MustCompile(`^sha256:[a-f0-9]{64}$|^sha512:[a-f0-9]{128}$`)
)

// ImageRefError says why an image reference is malformed.
type ImageRefError struct {
	Ref    string
	Reason string
}

func (e *ImageRefError) Error() string {
	return fmt.Sprintf("%q is not an image reference (%s); expected [registry[:port]/]name[:tag][@sha256:<64 hex digits>], e.g. \"docker.io/vllm/vllm-openai:v0.11.0\"", e.Ref, e.Reason)
}

// ParseImageRef checks an image reference's shape.
func ParseImageRef(ref string) (ImageRef, error) {
	bad := func(reason string) (ImageRef, error) { return ImageRef{}, &ImageRefError{Ref: ref, Reason: reason} }
	if ref == "" {
		return bad("empty")
	}
	if len(ref) > 255 {
		return bad("longer than 255 characters")
	}
	if strings.ContainsAny(ref, " \t\n") {
		return bad("contains white space")
	}
	var r ImageRef
	rest := ref
	if i := strings.IndexByte(rest, '@'); i >= 0 {
		r.Digest, rest = rest[i+1:], rest[:i]
		if !digestRe.MatchString(r.Digest) {
			return bad(fmt.Sprintf("digest %q is not sha256:<64 lowercase hex digits>", r.Digest))
		}
	}
	if i := strings.LastIndexByte(rest, ':'); i >= 0 && !strings.Contains(rest[i:], "/") {
		r.Tag, rest = rest[i+1:], rest[:i]
		if !tagRe.MatchString(r.Tag) {
			return bad(fmt.Sprintf("tag %q: letters, digits, _ . - (at most 128, not starting with . or -)", r.Tag))
		}
	}
	if i := strings.IndexByte(rest, '/'); i >= 0 {
		first := rest[:i]
		// As Docker's parser: the first component is a registry when it
		// has a dot or a port, or is localhost.
		if strings.ContainsAny(first, ".:[") || first == "localhost" {
			if !domainRe.MatchString(first) {
				return bad(fmt.Sprintf("registry %q is not a host name with an optional port", first))
			}
			r.Domain, rest = first, rest[i+1:]
		}
	}
	if rest == "" {
		return bad("no image name")
	}
	for _, c := range strings.Split(rest, "/") {
		if !pathComponentRe.MatchString(c) {
			return bad(fmt.Sprintf("name component %q: lowercase letters and digits, separated by . _ __ or -", c))
		}
	}
	r.Path = rest
	return r, nil
}

// validateImage checks image against binary and the reference's shape.
func (c TaskConfig) validateImage() error {
	var errs []error
	if c.Image == "" {
		if c.Auth != nil {
			errs = append(errs, fieldErr("auth", "registry credentials are only used with image"))
		}
		return errors.Join(errs...)
	}
	if c.Binary != "" {
		errs = append(errs, fieldErr("binary", "binary and image are exclusive: image runs the engine's own command (%s) inside the container; remove one", engineCommand(c.Engine)))
	}
	if _, err := ParseImageRef(c.Image); err != nil {
		errs = append(errs, &FieldError{Field: "image", Msg: err.Error()})
	}
	if c.Auth != nil && (c.Auth.Username == "") != (c.Auth.Password == "") {
		errs = append(errs, fieldErr("auth", "needs both username and password"))
	}
	return errors.Join(errs...)
}

// engineCommand names what an engine's image must have on its PATH.
func engineCommand(engine string) string {
	switch engine {
	case EngineVLLM:
		return "vllm"
	case EngineSGLang:
		return "python3 -m sglang.launch_server"
	case EngineLlamaCpp:
		return "llama-server"
	case EngineTRTLLM:
		return "trtllm-serve"
	case EngineSim:
		return "oasis-sim"
	}
	return engine
}
