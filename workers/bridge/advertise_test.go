package bridge

import "testing"

// --advertise-addr: the worker registers the engine URL's scheme and path
// on the advertised host and port (the pod's ip:port an endpoint picker
// sees), and an unusable address is a config error.
func TestAdvertisedEndpoint(t *testing.T) {
	for _, c := range []struct{ engine, advertise, want string }{
		{"http://127.0.0.1:8000", "", "http://127.0.0.1:8000"},
		{"http://127.0.0.1:8000", "10.1.2.3:8000", "http://10.1.2.3:8000"},
		{"http://127.0.0.1:8000/v1", "10.1.2.3:9000", "http://10.1.2.3:9000/v1"},
		{"http://127.0.0.1:8000", "https://[fd00::5]:8443", "https://[fd00::5]:8443"},
		{"http://127.0.0.1:8000", "10.1.2.3", ""},
		{"http://127.0.0.1:8000", "http://", ""},
	} {
		if got := (Config{EngineURL: c.engine, Advertise: c.advertise}).endpoint(); got != c.want {
			t.Errorf("engine %s, advertise %q: %q, want %q", c.engine, c.advertise, got, c.want)
		}
	}
}
