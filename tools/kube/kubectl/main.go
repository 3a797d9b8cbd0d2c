// Command kubectl is Kubernetes' CLI, built from k8s.io/kubectl at the version of the local control
// plane (tools/kube/versions.env; see scripts/build-kube.sh): what an on-call engineer reads the
// reconciler's pods with (`kubectl logs`, `kubectl exec`) in the local environment.
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	if err := cli.RunNoErrOutput(cmd.NewDefaultKubectlCommand()); err != nil {
		util.CheckErr(err)
	}
}
