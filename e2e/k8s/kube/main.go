// Command k8s is a multi-call Kubernetes v1.34.4 binary for the FlightCache e2e cluster.
//
// It dispatches on the name it was started as (argv[0], usually a symlink) or,
// when started as "k8s", on its first argument:
//
//	kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy, kubectl
//
// Each entry point is the one the upstream cmd/<name>/<name>.go main calls.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	_ "time/tzdata" // CronJob time zones (kube-apiserver, kube-controller-manager)

	"github.com/spf13/cobra"
	_ "k8s.io/client-go/plugin/pkg/client/auth" // kubectl auth plugins
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	kcm "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

var commands = map[string]func() *cobra.Command{
	"kube-apiserver":          apiserver.NewAPIServerCommand,
	"kube-controller-manager": kcm.NewControllerManagerCommand,
	"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
	"kubelet":                 func() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) },
	"kube-proxy":              proxy.NewProxyCommand,
}

func main() {
	name := filepath.Base(os.Args[0])
	if _, ok := commands[name]; !ok && name != "kubectl" && len(os.Args) > 1 {
		// started as "k8s <component> [flags]": shift the component name off
		name = os.Args[1]
		os.Args = os.Args[1:]
	}
	if name == "kubectl" {
		runKubectl()
		return
	}
	newCommand, ok := commands[name]
	if !ok {
		names := []string{"kubectl"}
		for n := range commands {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(os.Stderr, "usage: k8s COMPONENT [flags], or start it through a link named COMPONENT\ncomponents: %v\n", names)
		os.Exit(2)
	}
	os.Exit(cli.Run(newCommand()))
}

// runKubectl mirrors cmd/kubectl/kubectl.go.
func runKubectl() {
	logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args)) // nolint:errcheck
	command := kubectlcmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		kubectlutil.CheckErr(err)
	}
}
