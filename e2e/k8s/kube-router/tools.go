//go:build tools

// Package tools pins kube-router v2.1.0 for the e2e NetworkPolicy test: its network policy
// controller (iptables + ipset) enforces the NetworkPolicies the operator writes.
// e2e/network-policy builds it from this module's go.mod and go.sum.
package tools

import (
	_ "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"
)
