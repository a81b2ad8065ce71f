package config

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestParseImageRef(t *testing.T) {
	digest := "sha256:" + strings.Repeat("ab", 32)
	for _, tc := range []struct {
		ref  string
		want ImageRef
	}{
		{"vllm/vllm-openai:v0.11.0", ImageRef{Path: "vllm/vllm-openai", Tag: "v0.11.0"}},
		{"docker.io/lmsysorg/sglang:v0.5.4-cu126", ImageRef{Domain: "docker.io", Path: "lmsysorg/sglang", Tag: "v0.5.4-cu126"}},
		{"ghcr.io/ggml-org/llama.cpp:server-cuda", ImageRef{Domain: "ghcr.io", Path: "ggml-org/llama.cpp", Tag: "server-cuda"}},
		{"localhost/oasis-sim:test", ImageRef{Domain: "localhost", Path: "oasis-sim", Tag: "test"}},
		{"registry.internal:5000/team/vllm@" + digest, ImageRef{Domain: "registry.internal:5000", Path: "team/vllm", Digest: digest}},
		{"vllm/vllm-openai:v0.11.0@" + digest, ImageRef{Path: "vllm/vllm-openai", Tag: "v0.11.0", Digest: digest}},
		{"ubuntu", ImageRef{Path: "ubuntu"}},
	} {
		got, err := ParseImageRef(tc.ref)
		if err != nil || got != tc.want {
			t.Errorf("ParseImageRef(%q) = %+v, %v; want %+v", tc.ref, got, err, tc.want)
		}
	}
	for _, ref := range []string{
		"", "Vllm/vllm-openai", "vllm/vllm-openai:", "vllm/vllm-openai:-x", "vllm//openai",
		"vllm/vllm-openai@sha256:abc", "vllm/vllm-openai@md5:" + strings.Repeat("a", 32),
		"reg istry/x", "/x", "x/", "host:99999999999x/a",
	} {
		_, err := ParseImageRef(ref)
		var re *ImageRefError
		if !errors.As(err, &re) {
			t.Errorf("ParseImageRef(%q) = %v, want an ImageRefError", ref, err)
		}
	}
}

func fieldsOf(err error) []string {
	var out []string
	var walk func(error)
	walk = func(err error) {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
			return
		}
		var fe *FieldError
		if errors.As(err, &fe) {
			out = append(out, fe.Field)
		}
	}
	walk(err)
	return out
}

func TestValidateImage(t *testing.T) {
	base := TaskConfig{Engine: EngineSim, Model: "m", Port: "http", KVEvents: new(bool)}
	ok := base
	ok.Image = "localhost/oasis-sim:test"
	ok.Auth = &ImageAuth{Username: "u", Password: "p"}
	if err := ok.Normalize().Validate(); err != nil {
		t.Fatalf("valid image config: %v", err)
	}
	for name, tc := range map[string]struct {
		mod   func(*TaskConfig)
		field string
	}{
		"binary and image": {func(c *TaskConfig) { c.Image, c.Binary = "vllm/vllm-openai:v1", "/bin/vllm" }, "binary"},
		"bad reference":    {func(c *TaskConfig) { c.Image = "Not A Ref" }, "image"},
		"auth no image":    {func(c *TaskConfig) { c.Auth = &ImageAuth{Username: "u", Password: "p"} }, "auth"},
		"auth half":        {func(c *TaskConfig) { c.Image, c.Auth = "a/b:c", &ImageAuth{Username: "u"} }, "auth"},
	} {
		c := base
		tc.mod(&c)
		fields := fieldsOf(c.Normalize().Validate())
		if len(fields) != 1 || fields[0] != tc.field {
			t.Errorf("%s: fields in error = %v, want [%s]", name, fields, tc.field)
		}
	}
	remote := TaskConfig{Engine: EngineOpenAICompat, Model: "m", Endpoint: "http://x/v1", Image: "a/b"}
	if f := fieldsOf(remote.Normalize().Validate()); len(f) != 1 || f[0] != "image" {
		t.Errorf("openai_compat with image: fields %v, want [image]", f)
	}
}

func TestImageAuthDecodesBlockList(t *testing.T) {
	var c TaskConfig
	if err := json.Unmarshal([]byte(`{"auth":[{"username":"u","password":"p"}]}`), &c); err != nil {
		t.Fatal(err)
	}
	if c.Auth == nil || c.Auth.Username != "u" || c.Auth.Password != "p" {
		t.Fatalf("auth = %+v", c.Auth)
	}
}

func TestContainerConfigValidate(t *testing.T) {
	if err := (ContainerConfig{}).Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	err := ContainerConfig{Runtime: "lxc", Socket: "tcp://x:1"}.Validate()
	if f := fieldsOf(err); len(f) != 2 || f[0] != "container.runtime" || f[1] != "container.socket" {
		t.Fatalf("fields %v (%v)", f, err)
	}
}
