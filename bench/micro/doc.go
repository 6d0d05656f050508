// Package micro runs the project's Go microbenchmarks and writes
// docs/benchmarks.md: each figure (the median over -count runs, as benchstat
// reports it) next to its target from the issues, with the machine it ran on.
//
// Parse reads `go test -bench` output; Run produces it; Targets is the table
// of goals; Markdown renders. The kvrouter binary's `bench micro` subcommand
// wires them together. Nothing here imports the packages it measures.
package micro
