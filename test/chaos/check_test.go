package chaos

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const ms = time.Millisecond

// route is a successful route reply in a hand-made history.
func route(client int, session, mode string, from, to int, outcome, worker string, version uint64) Op {
	return Op{Client: client, Session: session, Mode: mode, Kind: Route, Via: "nats", Invoke: time.Duration(from) * ms,
		Return: time.Duration(to) * ms, Deadline: time.Second, Worker: worker, Outcome: outcome, Bound: worker, Version: version}
}

func read(client int, session string, from, to int, worker string, version uint64) Op {
	o := Op{Client: client, Session: session, Mode: Hard, Kind: Read, Via: "http", Invoke: time.Duration(from) * ms,
		Return: time.Duration(to) * ms, Bound: worker, Worker: worker, Version: version}
	if worker == "" {
		o.Code, o.Status = "not_found", 404
	}
	return o
}

func failed(client int, session, mode string, from, to int, code string) Op {
	o := Op{Client: client, Session: session, Mode: mode, Kind: Route, Via: "http", Invoke: time.Duration(from) * ms,
		Return: time.Duration(to) * ms, Deadline: time.Second, Code: code, Status: 503}
	if code == "" {
		o.Transport = "timeout"
	}
	return o
}

func rejected(client int, session string, from, to int, bound string) Op {
	o := failed(client, session, Hard, from, to, "binding_rejected")
	o.Status, o.RejectedFor, o.Restricted = 409, bound, true
	return o
}

func testConfig() CheckConfig {
	return CheckConfig{StaleBound: time.Second, LateSlack: 500 * ms, SessionTimeout: 10 * time.Second,
		Allowed: map[string]bool{"overloaded": true, "no_eligible_worker": true, "not_ready": true}}
}

func TestLinearizability(t *testing.T) {
	cases := []struct {
		name string
		ops  []Op
		ok   bool
	}{
		{"clean: created, fresh, renewed, read", []Op{
			route(0, "s", Hard, 0, 10, "created", "w1", 1),
			route(1, "s", Hard, 20, 30, "fresh", "w1", 1),
			route(2, "s", Hard, 25, 40, "renewed", "w1", 1),
			read(3, "s", 50, 60, "w1", 1),
		}, true},
		{"concurrent creates: the loser sees the winner's binding", []Op{
			route(0, "s", Hard, 0, 10, "created", "w1", 1),
			route(1, "s", Hard, 1, 12, "fresh", "w1", 1),
		}, true},
		{"fresh v1 with no create before it (a create that reported fresh, issue 25)", []Op{
			route(0, "s", Hard, 0, 10, "fresh", "w1", 1),
			route(1, "s", Hard, 20, 30, "fresh", "w1", 1),
		}, false},
		{"fresh v1 after a failed route (its create may have landed)", []Op{
			failed(0, "s", Hard, 0, 10, "bindings_unavailable"),
			route(1, "s", Hard, 20, 30, "fresh", "w1", 1),
		}, true},
		{"two creates on different workers", []Op{
			route(0, "s", Hard, 0, 10, "created", "w1", 1),
			route(1, "s", Hard, 20, 30, "created", "w2", 1),
		}, false},
		{"stale read: fresh v1 after the re-bind to v2 returned", []Op{
			route(0, "s", Hard, 0, 10, "created", "w1", 1),
			route(1, "s", Hard, 20, 30, "rebound", "w2", 2),
			route(2, "s", Hard, 40, 50, "fresh", "w1", 1),
		}, false},
		{"fresh v1 concurrent with the re-bind may come first", []Op{
			route(0, "s", Hard, 0, 10, "created", "w1", 1),
			route(1, "s", Hard, 20, 30, "rebound", "w2", 2),
			route(2, "s", Hard, 25, 50, "fresh", "w1", 1),
		}, true},
		{"404 after the create returned", []Op{
			route(0, "s", Hard, 0, 10, "created", "w1", 1),
			read(1, "s", 20, 30, "", 0),
		}, false},
		{"404 before the create", []Op{
			read(1, "s", 0, 5, "", 0),
			route(0, "s", Hard, 10, 20, "created", "w1", 1),
		}, true},
		{"a failed request may have created the binding", []Op{
			failed(0, "s", Hard, 0, 10, "overloaded"),
			route(1, "s", Hard, 20, 30, "fresh", "w3", 1),
			route(2, "s", Hard, 40, 50, "fresh", "w3", 1),
		}, true},
		{"the binding a failed request made has one worker", []Op{
			failed(0, "s", Hard, 0, 10, ""),
			route(1, "s", Hard, 20, 30, "fresh", "w3", 1),
			route(2, "s", Hard, 40, 50, "fresh", "w2", 1),
		}, false},
		{"a failed request may also have done nothing", []Op{
			route(0, "s", Hard, 0, 10, "created", "w1", 1),
			failed(1, "s", Hard, 20, 30, "overloaded"),
			route(2, "s", Hard, 40, 50, "fresh", "w1", 1),
		}, true},
		{"re-bind skips a version", []Op{
			route(0, "s", Hard, 0, 10, "created", "w1", 1),
			route(1, "s", Hard, 20, 30, "rebound", "w2", 3),
		}, false},
		{"409 names the current binding", []Op{
			route(0, "s", Hard, 0, 10, "created", "w1", 1),
			rejected(1, "s", 20, 30, "w1"),
		}, true},
		{"409 names another worker", []Op{
			route(0, "s", Hard, 0, 10, "created", "w1", 1),
			rejected(1, "s", 20, 30, "w2"),
		}, false},
		{"409 on an unbound session", []Op{
			rejected(1, "s", 0, 10, "w2"),
		}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := Check(c.ops, testConfig())
			if err != nil {
				t.Fatal(err)
			}
			if got := len(r.NonLinear) == 0 && len(r.Undecided) == 0; got != c.ok {
				t.Fatalf("linearizable = %v, want %v\n%s", got, c.ok, r.Summary(3))
			}
		})
	}
}

func TestSessionsAreCheckedApart(t *testing.T) {
	ops := []Op{
		route(0, "a", Hard, 0, 10, "created", "w1", 1),
		route(1, "b", Hard, 0, 10, "created", "w2", 1),
		route(2, "b", Hard, 20, 30, "created", "w3", 1), // b created twice
		route(3, "a", Hard, 20, 30, "fresh", "w1", 1),
	}
	cfg := testConfig()
	cfg.VisualizeTo = t.TempDir()
	r, err := Check(ops, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.NonLinear) != 1 || r.NonLinear[0] != "b" || r.HardSessions != 2 {
		t.Fatalf("non-linearizable %v of %d sessions, want [b] of 2", r.NonLinear, r.HardSessions)
	}
	html, err := os.ReadFile(filepath.Join(cfg.VisualizeTo, "hard-sessions.html"))
	if err != nil || !strings.Contains(string(html), "<html") {
		t.Fatalf("visualisation: %v (%d bytes)", err, len(html))
	}
	if !r.Failed() || !strings.Contains(r.Summary(3), "not linearizable: session b") {
		t.Fatalf("summary does not name session b:\n%s", r.Summary(3))
	}
}

func TestStaleness(t *testing.T) {
	base := []Op{
		route(0, "s", Soft, 0, 10, "created", "w1", 1),
		route(1, "s", Soft, 100, 110, "rebound", "w2", 2),
	}
	cases := []struct {
		name  string
		op    Op
		stale time.Duration
		over  bool
	}{
		{"current binding", route(2, "s", Soft, 2000, 2010, "fresh", "w2", 2), 0, false},
		{"old binding within the bound", route(2, "s", Soft, 900, 910, "fresh", "w1", 1), 790 * ms, false},
		{"old binding past the bound", route(2, "s", Soft, 1500, 1510, "fresh", "w1", 1), 1390 * ms, true},
		{"old binding concurrent with the commit", route(2, "s", Soft, 105, 120, "fresh", "w1", 1), 0, false},
		{"kept_other names the old binding late", Op{Client: 2, Session: "s", Mode: Soft, Kind: Route, Invoke: 3000 * ms,
			Return: 3010 * ms, Outcome: "kept_other", Worker: "w3", Bound: "w1", Version: 1}, 2890 * ms, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			worst, over := Staleness(append(append([]Op(nil), base...), c.op), time.Second)
			if worst.By != c.stale || (len(over) > 0) != c.over {
				t.Fatalf("worst %v (%d over the bound), want %v (over: %v)", worst.By, len(over), c.stale, c.over)
			}
		})
	}
	// A 404 after the create returned is stale too.
	absent := read(3, "s", 1500, 1510, "", 0)
	absent.Mode = Soft
	if worst, _ := Staleness(append(base, absent), time.Second); worst.By != 1490*ms {
		t.Fatalf("404 stale by %v, want 1.49s", worst.By)
	}
}

func TestMovesAndAnswers(t *testing.T) {
	late := route(4, "c", Soft, 0, 3000, "created", "w1", 1)
	// Held by a cut link until 2900 ms: answered 100 ms after, in time.
	released := route(10, "c", Soft, 0, 3000, "created", "w1", 1)
	released.Released = 2900 * ms
	// Released at 1000 ms and still 2 s late after it.
	lateAfterHeal := route(11, "c", Soft, 0, 3000, "created", "w1", 1)
	lateAfterHeal.Released = 1000 * ms
	unanswered := failed(5, "d", Soft, 0, 11000, "")
	excused := failed(6, "d", Soft, 0, 11000, "")
	excused.Excused = true
	internal := failed(7, "e", Soft, 0, 10, "internal")
	softRejected := failed(8, "f", Soft, 0, 10, "binding_rejected") // Soft bindings never refuse
	hardRejected := rejected(9, "b", 60, 70, "w1")
	hardRejected.Restricted = false // allowed, counted apart
	ops := []Op{
		route(0, "a", Hard, 0, 10, "created", "w1", 1),
		route(1, "a", Hard, 20, 30, "rebound", "w2", 2),
		route(2, "b", Hard, 0, 10, "created", "w1", 1),
		rejected(3, "b", 20, 30, "w1"),
		failed(3, "b", Hard, 40, 50, "overloaded"),
		late, unanswered, excused, internal, softRejected, hardRejected, released, lateAfterHeal,
	}
	r, err := Check(ops, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Moved) != 1 || strings.Join(r.Moved["a"], ",") != "w1,w2" {
		t.Errorf("moved %v, want a: w1,w2", r.Moved)
	}
	if len(r.Late) != 2 || r.Late[0].Client != 4 || r.Late[1].Client != 11 {
		t.Errorf("late %v, want client 4's and 11's (late after the heal), not 10's (released by a heal 100 ms before)", r.Late)
	}
	if len(r.Unanswered) != 1 || r.Unanswered[0].Client != 5 {
		t.Errorf("unanswered %v, want client 5's", r.Unanswered)
	}
	if len(r.Undocument) != 2 || r.Undocument[0].Code != "internal" || r.Undocument[1].Client != 8 {
		t.Errorf("codes not allowed %v, want the internal error and the Soft binding_rejected", r.Undocument)
	}
	if r.Errors["binding_rejected (no allowed_workers)"] != 2 { // the Soft one and the unrestricted Hard one
		t.Errorf("errors by code %v: the unrestricted refusals not counted apart", r.Errors)
	}
	if r.Errors["overloaded"] != 1 || r.Errors["transport"] != 1 || r.Errors["transport (excused: a connection dropped or the network was cut)"] != 1 {
		t.Errorf("errors by code %v", r.Errors)
	}
}

func TestCleanHistoryPasses(t *testing.T) {
	ops := []Op{
		route(0, "h", Hard, 0, 10, "created", "w1", 1),
		route(1, "h", Hard, 5, 20, "fresh", "w1", 1),
		read(2, "h", 30, 40, "w1", 1),
		route(0, "s", Soft, 0, 10, "created", "w2", 1),
		route(1, "s", Soft, 50, 60, "rebound", "w3", 2),
		route(2, "s", Soft, 55, 70, "fresh", "w2", 1),
		failed(3, "s", Soft, 80, 90, "no_eligible_worker"),
	}
	r, err := Check(ops, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	if r.Failed() {
		t.Fatalf("clean history rejected:\n%s", r.Summary(5))
	}
}

// The summary shows a long session from where its violation is.
func TestFirstIllegalFindsTheViolation(t *testing.T) {
	ops := []Op{route(0, "s", Hard, 0, 10, "created", "w1", 1)}
	for i := 1; i < 30; i++ {
		ops = append(ops, route(i%4, "s", Hard, 20*i, 20*i+10, "fresh", "w1", 1))
	}
	ops = append(ops, read(1, "s", 700, 710, "", 0)) // index 30: a 404 after the create
	for i := 0; i < 10; i++ {
		ops = append(ops, route(2, "s", Hard, 800+20*i, 810+20*i, "fresh", "w1", 1))
	}
	if got := firstIllegal(ops, time.Second*2); got != 30 {
		t.Fatalf("firstIllegal = %d, want 30", got)
	}
}
