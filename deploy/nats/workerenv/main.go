// Command workerenv prints the environment variables of one worker user of
// deploy/nats/auth.conf as shell exports:
//
//	eval "$(go run ./deploy/nats/workerenv --model m --worker gpu-0)"
package main

import (
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"

	natsauth "github.com/kvrouter/kvrouter/deploy/nats"
)

func main() {
	model := flag.String("model", "", "model the worker serves (required)")
	worker := flag.String("worker", "", "worker id (required)")
	prefix := flag.String("var", natsauth.DefaultWorkerVar, "variable prefix of the worker block in auth.conf")
	flag.Parse()
	if *model == "" || *worker == "" {
		fmt.Fprintln(os.Stderr, "workerenv: --model and --worker are required")
		os.Exit(2)
	}
	env := natsauth.WorkerEnv(*prefix, *model, *worker)
	names := make([]string, 0, len(env))
	for k := range env {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Printf("export %s='%s'\n", k, strings.ReplaceAll(env[k], "'", `'\''`))
	}
}
