package testbed

import "path/filepath"

// AllocDir is an allocation's directory on the stack's client node (its task directories, with
// their secrets directories, which Nomad's file-system API does not serve).
func (s *Stack) AllocDir(allocID string) string {
	return filepath.Join(s.nomadDataDir(), "alloc", allocID)
}
