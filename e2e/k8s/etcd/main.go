// Command etcd is etcd v3.6 (go.etcd.io/etcd/server/v3) for the FlightCache e2e cluster;
// the same main as upstream's server/main.go.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
