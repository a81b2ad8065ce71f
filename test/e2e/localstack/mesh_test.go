package localstack

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

// TestUpMeshServesMeshClients does what `make up MESH=1` and `make down` do: the stack in
// the service mesh (bridge networking, jobs/mesh intentions, the router Connect-native, the
// demo engines behind sidecars); a client with the oasis-client identity the output names
// streams a chat completion through router → sidecar → engine; make down leaves nothing,
// the bridge network included.
func TestUpMeshServesMeshClients(t *testing.T) {
	root, err := testbed.RepoRoot()
	must.NoError(t, err)
	// Short: Nomad puts unix sockets in allocation directories under home (107-byte limit).
	tmp, err := os.MkdirTemp("/tmp", "om")
	must.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(tmp) })
	// Traversable by other users: the llm driver runs engines as its default_user (nobody)
	// from the stack's bin/ under it.
	must.NoError(t, os.Chmod(tmp, 0o755))
	home := filepath.Join(tmp, "h")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	var out bytes.Buffer
	s, err := Up(ctx, root, home, io.MultiWriter(&out, testWriter{t}), Options{Mesh: true})
	downAtEnd(t, home)
	if err != nil && s != nil {
		t.Logf("nomad log:\n%s", s.NomadLog())
	}
	must.NoError(t, err)
	for _, want := range []string{"applied jobs/mesh", "ran jobs/router.nomad.hcl", "ran " + meshRecipe + "/job.nomad.hcl",
		"Mesh API:", "-service " + meshClientService + " -upstream oasis-router"} {
		must.StrContains(t, out.String(), want)
	}
	_, err = s.WaitMeshPassing(ctx, 3)
	must.NoError(t, err)

	id, err := s.MeshIdentity(ctx, meshClientService)
	must.NoError(t, err)
	defer id.Close()
	routers, _, err := s.Consul.Health().Connect("oasis-router", "", true, nil)
	must.NoError(t, err)
	must.Len(t, 1, routers)
	router := "https://" + net.JoinHostPort(routers[0].Service.Address, fmt.Sprint(routers[0].Service.Port))
	tr := &http.Transport{TLSClientConfig: id.ClientConfig("oasis-router", "h2", "http/1.1"), ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	var events []string
	waitReadyWith(t, ctx, client, router) // the router finds the engines' sidecars a moment after they pass
	events = streamChatWith(t, ctx, client, router, demoModel, "You are a helpful assistant.", "Hello, mesh!")
	must.Greater(t, 1, len(events))
	must.Eq(t, "[DONE]", events[len(events)-1])

	bridge := s.BridgeName()
	must.NotEq(t, "", bridge)
	downLeavesNothing(t, home, "mesh stack")
	_, err = net.InterfaceByName(bridge)
	must.Error(t, err, must.Sprint("the stack's bridge survived make down"))
}
