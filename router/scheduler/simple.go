package scheduler

// The load-balancing builtins that read no cache state: round-robin,
// random, least-loaded and power-of-two, and the respect_soft_affinity
// wrapper the registry puts around them.

// softAffinity wraps a policy so that a Soft target that is a candidate is
// the only candidate the inner policy sees (the respect_soft_affinity option
// of the load-balancing builtins).
type softAffinity struct{ inner Policy }

func (p softAffinity) Name() string { return p.inner.Name() }

func (p softAffinity) Select(x *Context, c *Candidates) (int, error) {
	if c.anyAffinityTarget() {
		keep := x.bools(c.Len())
		for i, s := range c.slots {
			keep[i] = c.aff.matches(c.f, s)
		}
		c.Retain(keep)
	}
	return p.inner.Select(x, c)
}

// RoundRobin cycles through the candidates by the scheduler's selection
// counter (pure: the counter is in the context).
type RoundRobin struct{}

// Name implements Policy.
func (RoundRobin) Name() string { return "round-robin" }

// Select implements Policy.
func (RoundRobin) Select(x *Context, c *Candidates) (int, error) {
	if c.Len() == 0 {
		return 0, ErrNoCandidate
	}
	return int(x.Seq % uint64(c.Len())), nil
}

// Random picks uniformly.
type Random struct{}

// Name implements Policy.
func (Random) Name() string { return "random" }

// Select implements Policy.
func (Random) Select(x *Context, c *Candidates) (int, error) {
	if c.Len() == 0 {
		return 0, ErrNoCandidate
	}
	return x.IntN(c.Len()), nil
}

// lighter orders two candidates by active requests, then booked prefill
// tokens: -1 when i is less loaded, 1 when j is, 0 when equal.
func lighter(c *Candidates, i, j int) int {
	si, sj := c.slots[i], c.slots[j]
	switch {
	case c.f.active[si] < c.f.active[sj]:
		return -1
	case c.f.active[si] > c.f.active[sj]:
		return 1
	case c.f.prefill[si] < c.f.prefill[sj]:
		return -1
	case c.f.prefill[si] > c.f.prefill[sj]:
		return 1
	}
	return 0
}

// leastLoaded returns the least-loaded candidate among those accepted by in
// (nil = all), ties broken uniformly at random; -1 when none.
func leastLoaded(x *Context, c *Candidates, in func(i int) bool) int {
	bi, ties := -1, 0
	for i := range c.slots {
		if in != nil && !in(i) {
			continue
		}
		if bi < 0 {
			bi, ties = i, 1
			continue
		}
		switch lighter(c, i, bi) {
		case -1:
			bi, ties = i, 1
		case 0:
			bi, ties = x.rng.keepTied(bi, i, ties)
		}
	}
	return bi
}

// LeastLoaded picks the candidate with the fewest active requests (then the
// least booked prefill), ties at random.
type LeastLoaded struct{}

// Name implements Policy.
func (LeastLoaded) Name() string { return "least-loaded" }

// Select implements Policy.
func (LeastLoaded) Select(x *Context, c *Candidates) (int, error) {
	if c.Len() == 0 {
		return 0, ErrNoCandidate
	}
	return leastLoaded(x, c, nil), nil
}

// PowerOfTwo samples two distinct candidates and keeps the lighter.
type PowerOfTwo struct{}

// Name implements Policy.
func (PowerOfTwo) Name() string { return "power-of-two" }

// Select implements Policy.
func (PowerOfTwo) Select(x *Context, c *Candidates) (int, error) {
	n := c.Len()
	switch n {
	case 0:
		return 0, ErrNoCandidate
	case 1:
		return 0, nil
	}
	a := x.IntN(n)
	b := x.IntN(n - 1)
	if b >= a {
		b++
	}
	if lighter(c, b, a) < 0 {
		return b, nil
	}
	return a, nil
}
