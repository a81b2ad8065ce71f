package deviceplugin

import "fmt"

// criticalXIDs are the Xid codes that make a GPU unfit for new work until it
// is reset (or the node is serviced). Each entry says why. The selection
// follows NVIDIA's Xid catalogue: an Xid is critical here when the fault is in
// the GPU, its memory or its links — not in the application that happened to
// run on it.
var criticalXIDs = map[uint64]string{
	48:  "double-bit ECC error: uncorrectable memory error, GPU reset required",
	61:  "internal micro-controller breakpoint/warning: firmware fault, GPU reset required",
	62:  "internal micro-controller halt: firmware stopped, GPU reset required",
	63:  "ECC page retirement or row remapping recording event: memory repair pending, GPU reset required",
	64:  "ECC page retirement or row remapper recording failure: memory cannot be repaired",
	74:  "NVLink error: link fault, multi-GPU traffic unreliable",
	79:  "GPU has fallen off the bus",
	92:  "high single-bit ECC error rate: memory degrading",
	95:  "uncontained ECC error: all contexts on the GPU affected, GPU reset required",
	119: "GSP RPC timeout: GPU system processor unresponsive, GPU reset required",
	120: "GSP error: GPU system processor fault, GPU reset required",
	140: "unrecovered ECC error: GPU reset required",
}

// Deliberately not critical (logged as warnings): 13 graphics engine
// exception, 31 GPU memory page fault, 43 GPU stopped processing, 45
// preemptive cleanup, 68 video processor exception, 69 graphics engine class
// error, 94 contained ECC error (only the faulting context is killed, the GPU
// keeps serving others) and 109 context switch timeout. These are raised by
// a misbehaving or killed application; the GPU itself stays usable, and
// marking it unhealthy would let one bad job take a node's GPUs out of
// scheduling.

// xidReason returns the health description for a critical Xid, or "" when the
// Xid is not critical.
func xidReason(xid uint64) string {
	why, ok := criticalXIDs[xid]
	if !ok {
		return ""
	}
	return fmt.Sprintf("critical Xid %d: %s", xid, why)
}
