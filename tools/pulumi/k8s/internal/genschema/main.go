// Command genschema produces the two files that the Kubernetes provider's main embeds
// (schema-embed.json and terraform-mapping-embed.json) from the schema.json and
// terraform-mapping.json committed in the provider module, stamping the package
// version into the schema. It mirrors what the upstream `go generate` step does, so
// that the provider can be built straight from the Go module cache.
package main

import (
	"encoding/json"
	"flag"
	"log"
	"os"
	"path/filepath"

	"github.com/pulumi/pulumi/pkg/v3/codegen/schema"
)

func main() {
	src := flag.String("src", "", "directory holding schema.json and terraform-mapping.json")
	out := flag.String("out", "", "directory to write the *-embed.json files to")
	version := flag.String("version", "", "package version to stamp into the schema (no leading v)")
	flag.Parse()
	if *src == "" || *out == "" || *version == "" {
		log.Fatal("usage: genschema -src DIR -out DIR -version X.Y.Z")
	}

	raw, err := os.ReadFile(filepath.Join(*src, "schema.json"))
	if err != nil {
		log.Fatal(err)
	}
	var spec schema.PackageSpec
	if err := json.Unmarshal(raw, &spec); err != nil {
		log.Fatalf("parsing schema.json: %v", err)
	}
	spec.Version = *version
	stamped, err := json.Marshal(spec)
	if err != nil {
		log.Fatal(err)
	}

	rawMapping, err := os.ReadFile(filepath.Join(*src, "terraform-mapping.json"))
	if err != nil {
		log.Fatal(err)
	}
	var mapping any
	if err := json.Unmarshal(rawMapping, &mapping); err != nil {
		log.Fatalf("parsing terraform-mapping.json: %v", err)
	}
	compact, err := json.Marshal(mapping)
	if err != nil {
		log.Fatal(err)
	}

	if err := os.MkdirAll(*out, 0o755); err != nil {
		log.Fatal(err)
	}
	for name, data := range map[string][]byte{
		"schema-embed.json":            stamped,
		"terraform-mapping-embed.json": compact,
	} {
		if err := os.WriteFile(filepath.Join(*out, name), data, 0o644); err != nil {
			log.Fatal(err)
		}
	}
}
