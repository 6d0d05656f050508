// Command gendashboard writes kvrouter's Grafana dashboard as JSON
// (go generate ./deploy/grafana runs it).
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/kvrouter/kvrouter/deploy/grafana"
)

func main() {
	out := flag.String("out", "kvrouter.json", "file to write")
	flag.Parse()
	js, err := grafana.JSON()
	if err == nil {
		err = os.WriteFile(*out, js, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gendashboard:", err)
		os.Exit(1)
	}
}
