//go:build tools

// Package tools pins the Kubernetes commands that scripts/build-kube.sh builds, so that
// `go mod tidy` keeps every module they need (the kubelet pulls in more than the control plane).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
