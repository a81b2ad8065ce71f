// Package supervisor runs an engine for the llm task driver in a process
// that outlives the driver: a re-execution of the driver's own binary
// ("nomad-driver-llm supervisor"), detached in its own session, that starts
// the engine, keeps its exit status until a client has read it, and serves
// Wait, Signal, Shutdown, Stats, Exec and Kill over a unix socket. The
// driver reattaches to it from the State stored in Nomad's task handle
// after a driver or Nomad client restart. See README.md.
package supervisor
