package workers

import (
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"
)

func validInfo(id string) Info {
	return Info{
		ID: id, Model: "meta-llama/Llama-3.1-8B", Endpoint: "kvr.worker.m." + id + ".generate",
		Ranks: []uint32{0}, BlockSize: 16, KVBlocks: 16384, MaxBatchedTokens: 8192, MaxSeqs: 256,
		Epoch: 42, Labels: map[string]string{"zone": "a"}, State: StateReady,
	}
}

func TestInfoValidate(t *testing.T) {
	tests := []struct {
		name  string
		mod   func(*Info)
		field string // "" = valid
	}{
		{"valid", func(*Info) {}, ""},
		{"draining", func(i *Info) { i.State = StateDraining }, ""},
		{"draining with deadline", func(i *Info) { i.State, i.DrainDeadline = StateDraining, time.Unix(1e9, 5) }, ""},
		{"deadline while ready", func(i *Info) { i.DrainDeadline = time.Unix(1e9, 0) }, "drain_deadline"},
		{"no labels", func(i *Info) { i.Labels = nil }, ""},
		{"dp ranks", func(i *Info) { i.Ranks = []uint32{0, 1, 2, 3} }, ""},
		{"empty id", func(i *Info) { i.ID = "" }, "id"},
		{"long id", func(i *Info) { i.ID = strings.Repeat("x", MaxIDLen+1) }, "id"},
		{"control in id", func(i *Info) { i.ID = "a\nb" }, "id"},
		{"bad utf8 id", func(i *Info) { i.ID = "a\xffb" }, "id"},
		{"empty model", func(i *Info) { i.Model = "" }, "model"},
		{"empty endpoint", func(i *Info) { i.Endpoint = "" }, "endpoint"},
		{"no ranks", func(i *Info) { i.Ranks = nil }, "ranks"},
		{"dup rank", func(i *Info) { i.Ranks = []uint32{1, 1} }, "ranks"},
		{"zero block size", func(i *Info) { i.BlockSize = 0 }, "block_size"},
		{"negative kv blocks", func(i *Info) { i.KVBlocks = -1 }, "kv_blocks"},
		{"zero batched", func(i *Info) { i.MaxBatchedTokens = 0 }, "max_batched_tokens"},
		{"zero seqs", func(i *Info) { i.MaxSeqs = 0 }, "max_seqs"},
		{"zero epoch", func(i *Info) { i.Epoch = 0 }, "epoch"},
		{"empty label name", func(i *Info) { i.Labels = map[string]string{"": "x"} }, "labels"},
		{"bad state", func(i *Info) { i.State = "gone" }, "state"},
		{"empty state", func(i *Info) { i.State = "" }, "state"},
		// LoRA adapter lists (adapters.go)
		{"adapters served and loaded", func(i *Info) { i.Adapters, i.LoadedAdapters, i.MaxLoRAs = []string{"a", "b"}, []string{"b"}, 2 }, ""},
		{"adapter loaded not served", func(i *Info) { i.LoadedAdapters = []string{"x"} }, ""},
		{"adapters unsorted", func(i *Info) { i.Adapters = []string{"b", "a"} }, "adapters"},
		{"adapter twice", func(i *Info) { i.LoadedAdapters = []string{"a", "a"} }, "loaded_adapters"},
		{"empty adapter", func(i *Info) { i.Adapters = []string{""} }, "adapters"},
		{"control in adapter", func(i *Info) { i.Adapters = []string{"a\tb"} }, "adapters"},
		{"too many adapters", func(i *Info) { i.Adapters = manyAdapters(MaxAdapters+1, 3) }, "adapters"},
		{"too many adapter bytes", func(i *Info) { i.Adapters = manyAdapters(100, 200) }, "adapters"},
		{"negative max loras", func(i *Info) { i.MaxLoRAs = -1 }, "max_loras"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := validInfo("w1")
			tc.mod(&in)
			err := in.Validate()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			var ie *InfoError
			if !errors.As(err, &ie) || !errors.Is(err, ErrInvalidInfo) {
				t.Fatalf("Validate = %v, want *InfoError wrapping ErrInvalidInfo", err)
			}
			if ie.Field != tc.field {
				t.Fatalf("field = %q, want %q (%v)", ie.Field, tc.field, err)
			}
		})
	}
}

func TestInfoRoundTrip(t *testing.T) {
	in := validInfo("w.1/ü")
	in.Ranks = []uint32{0, 3}
	in.State, in.DrainDeadline = StateDraining, time.Unix(1_800_000_000, 123456789)
	b, err := EncodeInfo(in)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"v":1`) {
		t.Fatalf("encoded value lacks the version: %s", b)
	}
	out, err := DecodeInfo(b)
	if err != nil {
		t.Fatal(err)
	}
	if !out.Equal(in) {
		t.Fatalf("round trip: got %+v, want %+v", out, in)
	}
	if keys := out.Targets(); len(keys) != 2 || keys[1].Worker != in.ID || keys[1].Rank != 3 {
		t.Fatalf("Targets = %v", keys)
	}
	c := in.Clone()
	c.Ranks[0] = 9
	c.Labels["zone"] = "b"
	if in.Ranks[0] != 0 || in.Labels["zone"] != "a" {
		t.Fatal("Clone shares slices or maps")
	}
}

func TestDecodeInfoRejects(t *testing.T) {
	good, _ := EncodeInfo(validInfo("w1"))
	tests := []struct {
		name, data, field string
	}{
		{"not json", "hello", "value"},
		{"empty", "", "value"},
		{"array", "[1,2]", "value"},
		{"wrong type", `{"v":1,"id":5}`, "value"},
		{"no version", strings.Replace(string(good), `"v":1,`, "", 1), "v"},
		{"future version", strings.Replace(string(good), `"v":1`, `"v":2`, 1), "v"},
		{"invalid field", strings.Replace(string(good), `"block_size":16`, `"block_size":0`, 1), "block_size"},
		{"too big", `{"v":1,"id":"` + strings.Repeat("x", MaxInfoBytes) + `"}`, "value"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeInfo([]byte(tc.data))
			var ie *InfoError
			if !errors.As(err, &ie) || !errors.Is(err, ErrInvalidInfo) || ie.Field != tc.field {
				t.Fatalf("DecodeInfo = %v, want InfoError on %q", err, tc.field)
			}
		})
	}
	// Unknown fields are tolerated (a newer worker may add some).
	extra := strings.Replace(string(good), `{`, `{"gpu":"h100",`, 1)
	if _, err := DecodeInfo([]byte(extra)); err != nil {
		t.Fatalf("unknown field rejected: %v", err)
	}
}

var kvKeyRE = regexp.MustCompile(`^[-/_=.a-zA-Z0-9]+$`)

func TestKeyFor(t *testing.T) {
	tests := []struct{ id, want string }{
		{"worker-0", "worker-0"},
		{"w_1", "w_1"},
		{"a.b", "a=2Eb"},
		{"a/b", "a=2Fb"},
		{"a=b", "a=3Db"},
		{"ü", "=C3=BC"},
		{"", "="},
		{".x.", "=2Ex=2E"},
	}
	for _, tc := range tests {
		if got := KeyFor(tc.id); got != tc.want {
			t.Errorf("KeyFor(%q) = %q, want %q", tc.id, got, tc.want)
		}
	}
}

func FuzzKeyFor(f *testing.F) {
	for _, s := range []string{"worker-0", "a.b", "=41", "ü", "a b", ".", "*>"} {
		f.Add(s, s+"x")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ka, kb := KeyFor(a), KeyFor(b)
		if !kvKeyRE.MatchString(ka) || strings.HasPrefix(ka, ".") || strings.HasSuffix(ka, ".") || strings.Contains(ka, ".") {
			t.Fatalf("KeyFor(%q) = %q is not a single-token KV key", a, ka)
		}
		if a != b && ka == kb {
			t.Fatalf("KeyFor(%q) == KeyFor(%q) == %q", a, b, ka)
		}
	})
}

func FuzzDecodeInfo(f *testing.F) {
	good, _ := EncodeInfo(validInfo("w1"))
	f.Add(good)
	f.Add([]byte(`{"v":1}`))
	f.Add([]byte(`{"v":1,"ranks":[0,0]}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		in, err := DecodeInfo(data)
		if err != nil {
			if !errors.Is(err, ErrInvalidInfo) {
				t.Fatalf("error does not wrap ErrInvalidInfo: %v", err)
			}
			return
		}
		// Whatever decodes must re-encode and decode to the same info.
		b, err := EncodeInfo(in)
		if err != nil {
			t.Fatalf("decoded info does not re-encode: %v", err)
		}
		out, err := DecodeInfo(b)
		if err != nil || !out.Equal(in) {
			t.Fatalf("re-decode: %v, %+v vs %+v", err, out, in)
		}
	})
}

func TestNewEpoch(t *testing.T) {
	seen := map[uint64]bool{}
	for range 1000 {
		e := NewEpoch()
		if e == 0 || e >= 1<<53 || seen[e] {
			t.Fatalf("NewEpoch = %d (zero, too large or repeated)", e)
		}
		seen[e] = true
	}
}

// registryKeyGolden is KeyFor of every byte value, 16 bytes per row (row i
// holds bytes 16i..16i+15): the registry keys workers have been written under.
// A change here orphans every registered worker's entry.
var registryKeyGolden = [16]string{
	"=00=01=02=03=04=05=06=07=08=09=0A=0B=0C=0D=0E=0F",
	"=10=11=12=13=14=15=16=17=18=19=1A=1B=1C=1D=1E=1F",
	"=20=21=22=23=24=25=26=27=28=29=2A=2B=2C-=2E=2F",
	"0123456789=3A=3B=3C=3D=3E=3F",
	"=40ABCDEFGHIJKLMNO",
	"PQRSTUVWXYZ=5B=5C=5D=5E_",
	"=60abcdefghijklmno",
	"pqrstuvwxyz=7B=7C=7D=7E=7F",
	"=80=81=82=83=84=85=86=87=88=89=8A=8B=8C=8D=8E=8F",
	"=90=91=92=93=94=95=96=97=98=99=9A=9B=9C=9D=9E=9F",
	"=A0=A1=A2=A3=A4=A5=A6=A7=A8=A9=AA=AB=AC=AD=AE=AF",
	"=B0=B1=B2=B3=B4=B5=B6=B7=B8=B9=BA=BB=BC=BD=BE=BF",
	"=C0=C1=C2=C3=C4=C5=C6=C7=C8=C9=CA=CB=CC=CD=CE=CF",
	"=D0=D1=D2=D3=D4=D5=D6=D7=D8=D9=DA=DB=DC=DD=DE=DF",
	"=E0=E1=E2=E3=E4=E5=E6=E7=E8=E9=EA=EB=EC=ED=EE=EF",
	"=F0=F1=F2=F3=F4=F5=F6=F7=F8=F9=FA=FB=FC=FD=FE=FF",
}

func TestKeyForGolden(t *testing.T) {
	for row, want := range registryKeyGolden {
		in := make([]byte, 16)
		for i := range in {
			in[i] = byte(16*row + i)
		}
		if got := KeyFor(string(in)); got != want {
			t.Errorf("KeyFor(bytes %#x..) = %q, want %q", 16*row, got, want)
		}
	}
}

// Unavailable is a valid state that routers do not choose, and it survives
// the wire.
func TestStateUnavailable(t *testing.T) {
	if !StateUnavailable.Valid() {
		t.Fatal("unavailable is not a valid state")
	}
	i := Info{ID: "w", Model: "m", Endpoint: "http://e:8000", Ranks: []uint32{0}, BlockSize: 16, KVBlocks: 1,
		MaxBatchedTokens: 1, MaxSeqs: 1, Epoch: 1, State: StateUnavailable}
	if i.Available() {
		t.Fatal("an unavailable worker is available")
	}
	b, err := EncodeInfo(i)
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodeInfo(b)
	if err != nil || back.State != StateUnavailable {
		t.Fatalf("decoded %+v, %v", back, err)
	}
}
