// Command coredns is a minimal CoreDNS v1.14.7 for the FlightCache e2e cluster: only the
// plugins the cluster's Corefile uses are compiled in, and none forwards queries upstream.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// directives keeps upstream's relative order (core/dnsserver/zdirectives.go) for the plugins above.
var directives = []string{
	"bind",
	"ready",
	"health",
	"errors",
	"log",
	"loadbalance",
	"cache",
	"kubernetes",
}

func init() {
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
