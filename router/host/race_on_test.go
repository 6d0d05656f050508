//go:build race

package host

// raceEnabled: the race detector drops sync.Pool items at random, so
// allocation counts of pooled code hold only without it.
const raceEnabled = true
