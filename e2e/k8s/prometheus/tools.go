//go:build tools

// Package tools pins the Prometheus server (github.com/prometheus/prometheus v0.316.0, i.e.
// Prometheus 3.16.0) for the e2e monitoring stack; e2e/monitoring builds cmd/prometheus from
// this module's go.mod and go.sum.
package tools

import _ "github.com/prometheus/prometheus/cmd/prometheus"
