package app

import (
	"net"

	"github.com/oasis-llm/oasis/router/discovery"
)

// Tests look inside a running router through these.

// Addr is the address the API listens on.
func (a *App) Addr() net.Addr { return a.ln.Addr() }

// Pool is the engine pool the configured discovery feeds.
func (a *App) Pool() *discovery.Pool { return a.pool }

// MeshAddr is the address the Connect-native listener listens on.
func (a *App) MeshAddr() net.Addr { return a.meshLn.Addr() }
