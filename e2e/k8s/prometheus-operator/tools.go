//go:build tools

// Package tools pins prometheus-operator v0.85.0 for the e2e monitoring stack
// (e2e/monitoring builds its commands from this module's go.mod and go.sum).
// prometheus-operator's own go.mod has replace directives, so `go install MOD@VERSION`
// refuses it; required from here, its nested modules come from the module proxy.
package tools

import (
	_ "github.com/prometheus-operator/prometheus-operator/cmd/operator"
	_ "github.com/prometheus-operator/prometheus-operator/cmd/prometheus-config-reloader"
)
