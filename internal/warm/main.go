package main

import (
	_ "github.com/nats-io/nats-server/v2/server"
	_ "github.com/nats-io/nats.go"
	_ "github.com/nats-io/nats.go/jetstream"
	_ "github.com/vmihailenco/msgpack/v5"
	_ "github.com/zeebo/xxh3"
	_ "go.opentelemetry.io/otel"
	_ "go.opentelemetry.io/otel/sdk/metric"
	_ "go.opentelemetry.io/otel/sdk/trace"
	_ "go.opentelemetry.io/otel/exporters/prometheus"
	_ "go.uber.org/goleak"
	_ "go.yaml.in/yaml/v3"
	_ "gonum.org/v1/plot"
)
func main() {}
