package driver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// podmanAPI is the libpod REST API version the client speaks (Podman 4.x).
const podmanAPI = "/v4.0.0"

// podmanClient talks to Podman's REST API (`podman system service`) over
// its unix socket, as HashiCorp's nomad-driver-podman does, with plain
// net/http.
type podmanClient struct {
	socket string
	http   *http.Client
}

func newPodmanClient(socketPath string) *podmanClient {
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	return &podmanClient{socket: socketPath, http: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, "unix", socketPath)
		},
	}}}
}

// PodmanError is a non-success answer of the Podman API.
type PodmanError struct {
	Op     string
	Status int
	Msg    string
}

func (e *PodmanError) Error() string {
	return fmt.Sprintf("podman %s: HTTP %d: %s", e.Op, e.Status, e.Msg)
}

// ErrImageNotFound is returned when an image is neither local nor pullable.
var ErrImageNotFound = errors.New("image not found")

func (c *podmanClient) do(ctx context.Context, method, path string, query url.Values, body any, hdr http.Header) (*http.Response, error) {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		r = bytes.NewReader(b)
	}
	u := "http://podman" + podmanAPI + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, r)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("podman API at %s: %w", c.socket, err)
	}
	return resp, nil
}

// call runs a request and decodes a JSON answer into out (nil: discard).
func (c *podmanClient) call(ctx context.Context, op, method, path string, query url.Values, body, out any) error {
	resp, err := c.do(ctx, method, path, query, body, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return apiError(op, resp)
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

func apiError(op string, resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	var m struct {
		Message string `json:"message"`
		Cause   string `json:"cause"`
	}
	msg := string(bytes.TrimSpace(b))
	if json.Unmarshal(b, &m) == nil && m.Message != "" {
		msg = m.Message
	}
	return &PodmanError{Op: op, Status: resp.StatusCode, Msg: msg}
}

// Version returns the Podman version behind the socket.
func (c *podmanClient) Version(ctx context.Context) (string, error) {
	var v struct {
		Version string `json:"Version"`
	}
	if err := c.call(ctx, "version", http.MethodGet, "/libpod/version", nil, nil, &v); err != nil {
		return "", err
	}
	return v.Version, nil
}

// ImageExists reports whether ref is in local storage.
func (c *podmanClient) ImageExists(ctx context.Context, ref string) (bool, error) {
	resp, err := c.do(ctx, http.MethodGet, "/libpod/images/"+ref+"/exists", nil, nil, nil)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusNoContent:
		return true, nil
	case http.StatusNotFound:
		return false, nil
	}
	return false, apiError("image exists", resp)
}

// ImageEntrypoint returns the entrypoint of a local image.
func (c *podmanClient) ImageEntrypoint(ctx context.Context, ref string) ([]string, error) {
	var out struct {
		Config struct {
			Entrypoint []string `json:"Entrypoint"`
		} `json:"Config"`
	}
	if err := c.call(ctx, "image inspect", http.MethodGet, "/libpod/images/"+ref+"/json", nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Config.Entrypoint, nil
}

// registryAuth is the X-Registry-Auth header value for credentials.
func registryAuth(user, password string) string {
	b, _ := json.Marshal(map[string]string{"username": user, "password": password})
	return base64.URLEncoding.EncodeToString(b)
}

// Pull pulls ref, calling progress with each line Podman reports. A pull
// Podman answers with an error wraps ErrImageNotFound.
func (c *podmanClient) Pull(ctx context.Context, ref, user, password string, progress func(string)) (string, error) {
	var hdr http.Header
	if user != "" {
		hdr = http.Header{"X-Registry-Auth": {registryAuth(user, password)}}
	}
	resp, err := c.do(ctx, http.MethodPost, "/libpod/images/pull",
		url.Values{"reference": {ref}, "policy": {"missing"}, "quiet": {"false"}}, nil, hdr)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return "", fmt.Errorf("%w: %s", ErrImageNotFound, apiError("pull", resp))
	}
	dec := json.NewDecoder(resp.Body)
	id := ""
	for {
		var m struct {
			Stream string   `json:"stream"`
			Error  string   `json:"error"`
			ID     string   `json:"id"`
			Images []string `json:"images"`
		}
		if err := dec.Decode(&m); err == io.EOF {
			break
		} else if err != nil {
			return "", fmt.Errorf("podman pull %s: reading progress: %w", ref, err)
		}
		switch {
		case m.Error != "":
			return "", fmt.Errorf("%w: podman pull %s: %s", ErrImageNotFound, ref, m.Error)
		case m.Stream != "" && progress != nil:
			progress(string(bytes.TrimSpace([]byte(m.Stream))))
		case m.ID != "":
			id = m.ID
		}
	}
	if id == "" {
		return "", fmt.Errorf("%w: podman pull %s: no image id in the answer", ErrImageNotFound, ref)
	}
	return id, nil
}

// containerSpec is the subset of libpod's SpecGenerator the driver sets.
type containerSpec struct {
	Name        string            `json:"name"`
	Image       string            `json:"image"`
	Entrypoint  []string          `json:"entrypoint"`
	Command     []string          `json:"command"`
	Env         map[string]string `json:"env,omitempty"`
	User        string            `json:"user,omitempty"`
	WorkDir     string            `json:"work_dir,omitempty"`
	NetNS       namespace         `json:"netns"`
	Mounts      []mount           `json:"mounts,omitempty"`
	Devices     []device          `json:"devices,omitempty"`
	StopSignal  int               `json:"stop_signal,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Resources   *resources        `json:"resource_limits,omitempty"`
	Remove      bool              `json:"remove,omitempty"`
	Terminal    bool              `json:"terminal"`
	CgroupsMode string            `json:"cgroups_mode,omitempty"`
}

type namespace struct {
	NSMode string `json:"nsmode"`
	Value  string `json:"value,omitempty"`
}

type mount struct {
	Destination string   `json:"destination"`
	Source      string   `json:"source"`
	Type        string   `json:"type"`
	Options     []string `json:"options,omitempty"`
}

type device struct {
	Path string `json:"path"`
}

type resources struct {
	Memory *struct {
		Limit int64 `json:"limit,omitempty"`
	} `json:"memory,omitempty"`
	CPU *struct {
		Shares uint64 `json:"shares,omitempty"`
	} `json:"cpu,omitempty"`
}

// Create creates a container and returns its id.
func (c *podmanClient) Create(ctx context.Context, spec *containerSpec) (string, error) {
	var out struct {
		ID string `json:"Id"`
	}
	if err := c.call(ctx, "create", http.MethodPost, "/libpod/containers/create", nil, spec, &out); err != nil {
		return "", err
	}
	return out.ID, nil
}

func (c *podmanClient) Start(ctx context.Context, id string) error {
	return c.call(ctx, "start", http.MethodPost, "/libpod/containers/"+id+"/start", nil, nil, nil)
}

// Kill sends a signal (a name such as "SIGTERM") to the container's process.
func (c *podmanClient) Kill(ctx context.Context, id, signal string) error {
	return c.call(ctx, "kill", http.MethodPost, "/libpod/containers/"+id+"/kill", url.Values{"signal": {signal}}, nil, nil)
}

func (c *podmanClient) Remove(ctx context.Context, id string) error {
	err := c.call(ctx, "remove", http.MethodDelete, "/libpod/containers/"+id, url.Values{"force": {"true"}}, nil, nil)
	var pe *PodmanError
	if errors.As(err, &pe) && pe.Status == http.StatusNotFound {
		return nil
	}
	return err
}

// containerState is the State of a container's inspection.
type containerState struct {
	Status     string    `json:"Status"`
	Running    bool      `json:"Running"`
	OOMKilled  bool      `json:"OOMKilled"`
	Pid        int       `json:"Pid"`
	ExitCode   int       `json:"ExitCode"`
	StartedAt  time.Time `json:"StartedAt"`
	FinishedAt time.Time `json:"FinishedAt"`
}

func (c *podmanClient) Inspect(ctx context.Context, id string) (*containerState, error) {
	var out struct {
		State containerState `json:"State"`
	}
	if err := c.call(ctx, "inspect", http.MethodGet, "/libpod/containers/"+id+"/json", nil, nil, &out); err != nil {
		return nil, err
	}
	return &out.State, nil
}

// Wait blocks until the container has exited and returns its exit code.
func (c *podmanClient) Wait(ctx context.Context, id string) (int, error) {
	resp, err := c.do(ctx, http.MethodPost, "/libpod/containers/"+id+"/wait", url.Values{"condition": {"exited"}}, nil, nil)
	if err != nil {
		return -1, err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return -1, apiError("wait", resp)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return -1, err
	}
	code, err := strconv.Atoi(string(bytes.TrimSpace(b)))
	if err != nil {
		return -1, fmt.Errorf("podman wait: unexpected answer %q", b)
	}
	return code, nil
}

// Logs streams the container's stdout and stderr from since (zero: from
// the start) into the writers until the container ends or ctx is done.
func (c *podmanClient) Logs(ctx context.Context, id string, since time.Time, stdout, stderr io.Writer) error {
	q := url.Values{"follow": {"true"}, "stdout": {"true"}, "stderr": {"true"}}
	if !since.IsZero() {
		q.Set("since", strconv.FormatInt(since.Unix(), 10))
	}
	resp, err := c.do(ctx, http.MethodGet, "/containers/"+id+"/logs", q, nil, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return apiError("logs", resp)
	}
	return demux(resp.Body, stdout, stderr)
}

// demux splits Docker's multiplexed stream: frames of an 8-byte header
// (stream, 0, 0, 0, big-endian length) and the payload.
func demux(r io.Reader, stdout, stderr io.Writer) error {
	br := bufio.NewReaderSize(r, 32<<10)
	var hdr [8]byte
	for {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return nil
			}
			return err
		}
		w := stdout
		if hdr[0] == 2 {
			w = stderr
		}
		n := int64(binary.BigEndian.Uint32(hdr[4:]))
		if _, err := io.CopyN(w, br, n); err != nil {
			return err
		}
	}
}

// containerStats is the part of the Docker-compatible stats answer the
// driver reports.
type containerStats struct {
	Read        time.Time `json:"read"`
	MemoryStats struct {
		Usage uint64            `json:"usage"`
		Limit uint64            `json:"limit"`
		Stats map[string]uint64 `json:"stats"`
	} `json:"memory_stats"`
	CPUStats struct {
		CPUUsage struct {
			TotalUsage        uint64 `json:"total_usage"`
			UsageInKernelmode uint64 `json:"usage_in_kernelmode"`
			UsageInUsermode   uint64 `json:"usage_in_usermode"`
		} `json:"cpu_usage"`
		SystemUsage uint64 `json:"system_cpu_usage"`
		OnlineCPUs  uint32 `json:"online_cpus"`
		Throttling  struct {
			Periods          uint64 `json:"periods"`
			ThrottledPeriods uint64 `json:"throttled_periods"`
			ThrottledTime    uint64 `json:"throttled_time"`
		} `json:"throttling_data"`
	} `json:"cpu_stats"`
}

func (c *podmanClient) Stats(ctx context.Context, id string) (*containerStats, error) {
	var s containerStats
	if err := c.call(ctx, "stats", http.MethodGet, "/containers/"+id+"/stats", url.Values{"stream": {"false"}}, nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}
