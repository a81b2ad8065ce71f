package testbed

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
)

// state is what a detached stack (`make up`) leaves on disk so another process (`make down`) can
// stop it.
type state struct {
	Dir        string `json:"dir"`
	BinDir     string `json:"bin_dir"`
	PluginDir  string `json:"plugin_dir"`
	ConsulAddr string `json:"consul_addr"`
	NomadAddr  string `json:"nomad_addr"`
	NodeID     string `json:"node_id"`
	// The management tokens ("" with ACLs off): the file is the operator's, mode 0600.
	ConsulToken string `json:"consul_token,omitempty"`
	NomadToken  string `json:"nomad_token,omitempty"`
	NomadPID    int    `json:"nomad_pid"`
	ConsulPID   int    `json:"consul_pid"`
	// Datacenter and Region are empty in files written before federations existed.
	Datacenter string `json:"datacenter,omitempty"`
	Region     string `json:"region,omitempty"`
	// The bridge network of a stack with Options.Bridge, which Close removes.
	BridgeName   string `json:"bridge_name,omitempty"`
	BridgeSubnet string `json:"bridge_subnet,omitempty"`
}

// federationState is what a detached federation leaves on disk.
type federationState struct {
	Dir string  `json:"dir"`
	DCs []state `json:"dcs"`
}

// Save writes what Load needs to find and stop this stack from another process.
func (s *Stack) Save(path string) error { return saveJSON(path, s.state()) }

// Save writes what LoadFederation needs to find and stop this federation from another process.
func (f *Federation) Save(path string) error {
	st := federationState{Dir: f.Dir}
	for _, s := range f.DCs {
		st.DCs = append(st.DCs, s.state())
	}
	return saveJSON(path, st)
}

func (s *Stack) state() state {
	st := state{
		Dir: s.Dir, BinDir: s.BinDir, PluginDir: s.PluginDir, ConsulAddr: s.ConsulAddr,
		NomadAddr: s.NomadAddr, NodeID: s.NodeID, ConsulToken: s.ConsulToken, NomadToken: s.NomadToken,
		Datacenter: s.Datacenter, Region: s.Region,
	}
	if s.bridge != nil {
		st.BridgeName, st.BridgeSubnet = s.bridge.name, s.bridge.subnet
	}
	if s.nomad != nil {
		st.NomadPID = s.nomad.pid
	}
	if s.consul != nil {
		st.ConsulPID = s.consul.pid
	}
	return st
}

// saveJSON writes v to a file only its owner can read: it holds the management tokens.
func saveJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding stack state: %w", err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("writing stack state: %w", err)
	}
	return nil
}

// Load reattaches to a stack saved by Save, for Close.
func Load(path string) (*Stack, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading stack state: %w", err)
	}
	var st state
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("decoding stack state %s: %w", path, err)
	}
	return fromState(st)
}

// LoadFederation reattaches to a federation saved by Federation.Save, for Close.
func LoadFederation(path string) (*Federation, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading federation state: %w", err)
	}
	var st federationState
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("decoding federation state %s: %w", path, err)
	}
	if st.Dir == "" {
		return nil, errors.New("federation state names no directory")
	}
	f := &Federation{Dir: st.Dir}
	for _, dc := range st.DCs {
		s, err := fromState(dc)
		if err != nil {
			return nil, err
		}
		f.DCs = append(f.DCs, s)
	}
	return f, nil
}

func fromState(st state) (*Stack, error) {
	if st.Dir == "" {
		return nil, errors.New("stack state names no directory")
	}
	if st.Region == "" {
		st.Datacenter, st.Region = "dc1", "global"
	}
	s := &Stack{
		Dir: st.Dir, BinDir: st.BinDir, PluginDir: st.PluginDir, ConsulAddr: st.ConsulAddr,
		NomadAddr: st.NomadAddr, NodeID: st.NodeID, ConsulToken: st.ConsulToken, NomadToken: st.NomadToken,
		Datacenter: st.Datacenter, Region: st.Region,
		acls: st.NomadToken != "", nomad: adopt(st.NomadPID), consul: adopt(st.ConsulPID), logf: func(string, ...any) {},
	}
	if st.BridgeName != "" {
		s.bridge = &bridgeNet{name: st.BridgeName, subnet: st.BridgeSubnet}
	}
	var err error
	if s.Consul, err = newConsulClient(s.ConsulAddr, s.ConsulToken); err != nil {
		return nil, err
	}
	if s.Nomad, err = newNomadClient(s.NomadAddr, s.NomadToken); err != nil {
		return nil, err
	}
	return s, nil
}

// adopt wraps a process this program did not start; its exit is noticed by polling.
func adopt(pid int) *process {
	if pid <= 0 {
		return nil
	}
	proc, err := os.FindProcess(pid)
	if err != nil {
		return nil
	}
	p := &process{pid: pid, proc: proc, done: make(chan struct{})}
	go func() {
		for syscall.Kill(pid, 0) == nil {
			time.Sleep(100 * time.Millisecond)
		}
		close(p.done)
	}()
	return p
}
