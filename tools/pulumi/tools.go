//go:build tools

// Package tools pins the Pulumi CLI in this module's go.mod/go.sum (`go mod tidy` keeps
// it); scripts/build-pulumi.sh builds it with `go build github.com/pulumi/pulumi/pkg/v3/cmd/pulumi`.
package tools

import _ "github.com/pulumi/pulumi/pkg/v3/cmd/pulumi"
