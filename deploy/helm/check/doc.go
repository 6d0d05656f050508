// Package check holds the CI check of the Helm chart in deploy/helm/kvrouter:
// helm lint and `helm template` through the Helm SDK (client only, no
// cluster) for the default values and a values matrix, every rendered
// object decoded strictly into its k8s.io/api type, and the generated NATS
// users checked against deploy/nats. It is its own Go module so that the
// kvrouter module's `go test ./...` never builds Helm and Kubernetes.
//
// Run it with `cd deploy/helm/check && go test ./...` (.ci/run does).
package check
