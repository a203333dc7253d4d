// Gateway API's conformance suite, run against balancer: the suite's own tests and base
// manifests, with one change made here, in the open. The base manifests' Gateways with HTTP
// or HTTPS listeners get the suite's `gateway-api/skip-this-for-readiness` annotation:
// balancer serves TCP, UDP and TLS passthrough only, so it reports those listeners
// `UnsupportedProtocol` and never `Programmed`, as Gateway API asks, and the suite's setup
// would otherwise wait for them forever (gateway-api issue #2403). Nothing else is changed;
// the tests that need those Gateways are skipped by name, with their reason, on the command
// line (see tests/kubernetes/conformance.sh and conformance/README.md).
package conformance

import (
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"

	"sigs.k8s.io/gateway-api/conformance"
	"sigs.k8s.io/yaml"
)

// Where the changed base manifests are, in the suite's manifest file systems.
const base = "balancer/base.yaml"

// The suite's annotation that keeps a Gateway out of its setup's readiness wait.
const skipReadiness = "gateway-api/skip-this-for-readiness"

func TestBalancer(t *testing.T) {
	opts := conformance.DefaultOptions(t)
	stock, err := fs.ReadFile(&conformance.Manifests, "base/manifests.yaml")
	if err != nil {
		t.Fatalf("the suite's base manifests: %v", err)
	}
	ours, err := markUnservedGateways(string(stock))
	if err != nil {
		t.Fatalf("the base manifests do not read: %v", err)
	}
	opts.ManifestFS = []fs.FS{fstest.MapFS{base: {Data: []byte(ours)}}, &conformance.Manifests}
	opts.BaseManifests = base
	conformance.RunConformanceWithOptions(t, opts)
}

// markUnservedGateways adds the readiness annotation to each Gateway with an HTTP or HTTPS
// listener, and returns the documents otherwise as they were.
func markUnservedGateways(stock string) (string, error) {
	docs := strings.Split(stock, "\n---\n")
	for i, doc := range docs {
		var object map[string]any
		if err := yaml.Unmarshal([]byte(doc), &object); err != nil {
			return "", err
		}
		if object["kind"] != "Gateway" || !servesHTTP(object) {
			continue
		}
		metadata, _ := object["metadata"].(map[string]any)
		annotations, _ := metadata["annotations"].(map[string]any)
		if annotations == nil {
			annotations = map[string]any{}
		}
		annotations[skipReadiness] = "true"
		metadata["annotations"] = annotations
		out, err := yaml.Marshal(object)
		if err != nil {
			return "", err
		}
		docs[i] = string(out)
	}
	return strings.Join(docs, "\n---\n"), nil
}

func servesHTTP(gateway map[string]any) bool {
	spec, _ := gateway["spec"].(map[string]any)
	listeners, _ := spec["listeners"].([]any)
	for _, l := range listeners {
		listener, _ := l.(map[string]any)
		if p := listener["protocol"]; p == "HTTP" || p == "HTTPS" {
			return true
		}
	}
	return false
}
