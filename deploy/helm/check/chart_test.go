package check

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/conf"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

const chartDir = "../kvrouter"

// cases is the values matrix: the defaults, then one case per way a
// deployment differs. Each renders, lints and decodes strictly.
var cases = []struct {
	name   string
	values string
	check  func(t *testing.T, r rendered)
}{
	{"defaults", ``, checkDefaults},
	{"existing NATS", `
nats: {enabled: false}
existingNats: {url: "nats://nats-0.messaging:4222,nats://nats-1.messaging:4222,nats://nats-2.messaging:4222", clusterSize: 3}
`, checkExistingNATS},
	{"TLS on", `
tls: {enabled: true, secretName: nats-client-tls, mutual: true}
gateway: {apiKeySecret: openai-key}
`, checkTLS},
	{"3 replicas", `
router: {replicas: 3}
gateway: {replicas: 3}
engine: {replicas: 3}
`, checkReplicas},
	{"data parallelism 2", `
engine: {dataParallelSize: 2, tensorParallelSize: 2, blockSize: 32, kvEventsPort: 6000, kvReplayPort: 6100, port: 8100}
blockSize: 32
`, checkDataParallel},
}

func TestChart(t *testing.T) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			vals := values(t, c.values)
			lintChart(t, vals)
			r := render(t, vals)
			c.check(t, r)
			checkAuthConf(t, r)
		})
	}
}

// A misspelt field fails the strict decoding every rendered object goes
// through (the proof that the matrix would catch one).
func TestStrictDecodeRejectsMisspeltField(t *testing.T) {
	good := "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replicas: 2\n"
	if _, err := decode([]byte(good)); err != nil {
		t.Fatalf("a correct Deployment did not decode: %v", err)
	}
	for _, bad := range []string{
		"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replica: 2\n",
		"apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  ports: [{name: http, port: 80, targetport: http}]\n",
		"apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: x}\nspec:\n  endpoint: []\n",
		"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replicas: 2\n  replicas: 3\n",
	} {
		if _, err := decode([]byte(bad)); err == nil {
			t.Errorf("decoded without error:\n%s", bad)
		}
	}
}

// The chart's copy of deploy/nats/auth.conf is that file (Helm reads only
// files inside the chart).
func TestAuthConfIsDeployNats(t *testing.T) {
	want, err := os.ReadFile("../../nats/auth.conf")
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(chartDir, "files/auth.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("deploy/helm/kvrouter/files/auth.conf differs from deploy/nats/auth.conf: cp deploy/nats/auth.conf deploy/helm/kvrouter/files/")
	}
}

// The chart escapes the worker's subjects and registry key as the
// components do: deploy/nats/workerenv prints the components' values.
func TestWorkerSubjectsAsComponents(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go run ./deploy/nats/workerenv")
	}
	model := "meta-llama/Llama-3.1-8B*x>y%z"
	r := render(t, values(t, fmt.Sprintf("models: [%q]\nengine: {replicas: 2}\n", model)))
	authConf := string(r.secret(t, "kvrouter-nats-auth").Data["auth.conf"])
	for _, pod := range []string{"kv-kvrouter-engine-0", "kv-kvrouter-engine-1"} {
		cmd := exec.Command("go", "run", "./deploy/nats/workerenv", "--model", model, "--worker", pod)
		cmd.Dir = "../../.."
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("workerenv: %v\n%s", err, out)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			_, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("workerenv line %q", line)
			}
			v = strings.Trim(v, "'") // the shell quoting; the value keeps its double quotes
			if !strings.Contains(authConf, v) {
				t.Errorf("auth.conf lacks %s of %s (%s)", v, pod, line)
			}
		}
	}
}

func values(t *testing.T, y string) map[string]any {
	t.Helper()
	v, err := chartutil.ReadValues([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// lintChart runs helm lint's rules; the only finding allowed above info is
// the NATS dependency missing from charts/ (it is fetched by `helm
// dependency build`, not vendored).
func lintChart(t *testing.T, vals map[string]any) {
	t.Helper()
	l := lint.All(chartDir, vals, "llm", false)
	for _, m := range l.Messages {
		if m.Severity == support.WarningSev && strings.Contains(m.Err.Error(), "missing these dependencies: nats") {
			continue
		}
		if m.Severity > support.InfoSev {
			t.Errorf("helm lint: %s", m)
		}
	}
}

// rendered holds the decoded objects of one `helm template`.
type rendered struct {
	objects map[string]any // "Kind/name" -> *appsv1.Deployment, ...
	raw     string
}

// render is `helm template kv deploy/helm/kvrouter -n llm` through the SDK
// (client only: no cluster), each object decoded strictly.
func render(t *testing.T, vals map[string]any) rendered {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	inst := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	inst.DryRun, inst.ClientOnly, inst.Replace = true, true, true
	inst.ReleaseName, inst.Namespace = "kv", "llm"
	rel, err := inst.Run(ch, vals)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	r := rendered{objects: map[string]any{}, raw: rel.Manifest}
	for _, doc := range strings.Split(rel.Manifest, "\n---\n") {
		if strings.TrimSpace(strings.TrimPrefix(doc, "---")) == "" {
			continue
		}
		obj, err := decode([]byte(doc))
		if err != nil {
			t.Fatalf("%v\n%s", err, doc)
		}
		r.objects[obj.key] = obj.value
	}
	return r
}

type object struct {
	key   string
	value any
}

// serviceMonitor is the part of monitoring.coreos.com/v1 ServiceMonitor the
// chart writes; another field is a misspelling.
type serviceMonitor struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metaObjectMeta    `json:"metadata"`
	Spec       serviceMonitorSpc `json:"spec"`
}

type metaObjectMeta struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
}

type serviceMonitorSpc struct {
	Selector struct {
		MatchLabels map[string]string `json:"matchLabels"`
	} `json:"selector"`
	Endpoints []struct {
		Port     string `json:"port"`
		Path     string `json:"path"`
		Interval string `json:"interval"`
	} `json:"endpoints"`
}

// decode turns one YAML document into its k8s.io/api type, refusing
// unknown fields (also a field whose case differs) and duplicate keys.
func decode(doc []byte) (object, error) {
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return object{}, fmt.Errorf("yaml: %w", err)
	}
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(js, &head); err != nil {
		return object{}, err
	}
	var v any
	switch head.APIVersion + " " + head.Kind {
	case "apps/v1 Deployment":
		v = &appsv1.Deployment{}
	case "apps/v1 StatefulSet":
		v = &appsv1.StatefulSet{}
	case "v1 Service":
		v = &corev1.Service{}
	case "v1 Secret":
		v = &corev1.Secret{}
	case "policy/v1 PodDisruptionBudget":
		v = &policyv1.PodDisruptionBudget{}
	case "monitoring.coreos.com/v1 ServiceMonitor":
		v = &serviceMonitor{}
	default:
		return object{}, fmt.Errorf("no strict type for %s %s", head.APIVersion, head.Kind)
	}
	// encoding/json matches field names case-insensitively ("targetport"
	// would fill targetPort), so the decoding the API server does follows:
	// case-sensitive, unknown and duplicate fields are errors.
	strict, err := kjson.UnmarshalStrict(js, v, kjson.DisallowUnknownFields, kjson.DisallowDuplicateFields)
	if err == nil && len(strict) > 0 {
		err = errors.Join(strict...)
	}
	if err != nil {
		return object{}, fmt.Errorf("%s %s: %w", head.Kind, head.Metadata.Name, err)
	}
	return object{key: head.Kind + "/" + head.Metadata.Name, value: v}, nil
}

// lookup returns the object kind/name of r as a T (*appsv1.Deployment, ...).
func lookup[T any](t *testing.T, r rendered, kind, name string) T {
	t.Helper()
	v, ok := r.objects[kind+"/"+name].(T)
	if !ok {
		t.Fatalf("no %s %s; have %v", kind, name, r.keys())
	}
	return v
}

func (r rendered) deployment(t *testing.T, name string) *appsv1.Deployment {
	t.Helper()
	return lookup[*appsv1.Deployment](t, r, "Deployment", name)
}

func (r rendered) statefulSet(t *testing.T, name string) *appsv1.StatefulSet {
	t.Helper()
	return lookup[*appsv1.StatefulSet](t, r, "StatefulSet", name)
}

func (r rendered) secret(t *testing.T, name string) *corev1.Secret {
	t.Helper()
	s := lookup[*corev1.Secret](t, r, "Secret", name)
	if s.Data == nil {
		s.Data = map[string][]byte{}
	}
	for k, v := range s.StringData {
		s.Data[k] = []byte(v)
	}
	return s
}

func (r rendered) keys() []string {
	var ks []string
	for k := range r.objects {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func container(t *testing.T, spec corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range spec.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %s", name)
	return corev1.Container{}
}

// hasArgs fails unless every want is one of c's args.
func hasArgs(t *testing.T, c corev1.Container, want ...string) {
	t.Helper()
	for _, w := range want {
		if !slices.Contains(c.Args, w) {
			t.Errorf("container %s lacks %s; args %q", c.Name, w, c.Args)
		}
	}
}

const (
	router  = "kv-kvrouter-router"
	gateway = "kv-kvrouter-gateway"
	engine  = "kv-kvrouter-engine"
)

func checkDefaults(t *testing.T, r rendered) {
	d := r.deployment(t, router)
	if *d.Spec.Replicas != 2 {
		t.Errorf("router replicas %d, want 2", *d.Spec.Replicas)
	}
	c := container(t, d.Spec.Template.Spec, "router")
	hasArgs(t, c, "serve", "--stream-replicas=3", "--nats-url=nats://kv-nats:4222", "--nats-user=router",
		"--nats-inbox-prefix=_INBOX_router", "--block-size=16", "--models=Qwen/Qwen3-8B", "--http-addr=:8080")
	if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" {
		t.Errorf("router readiness probe %+v, want GET /readyz", p)
	}
	if _, ok := r.objects["PodDisruptionBudget/"+router].(*policyv1.PodDisruptionBudget); !ok {
		t.Error("no PodDisruptionBudget for the routers")
	}
	if _, ok := r.objects["Service/"+gateway].(*corev1.Service); !ok {
		t.Error("no gateway Service")
	}
	g := container(t, r.deployment(t, gateway).Spec.Template.Spec, "gateway")
	hasArgs(t, g, "gateway", "--nats-user=gateway", "--nats-inbox-prefix=_INBOX_gateway", "--listen=:8000")
	if _, ok := r.objects["ServiceMonitor/kv-kvrouter"].(*serviceMonitor); !ok {
		t.Error("no ServiceMonitor")
	}
	s := r.statefulSet(t, engine)
	b := container(t, s.Spec.Template.Spec, "bridge")
	hasArgs(t, b, "bridge", "--model=Qwen/Qwen3-8B", "--worker-id=$(POD_NAME)", "--nats-user=$(POD_NAME)",
		"--nats-password-file=/etc/kvrouter/nats-auth/$(POD_NAME)", "--engine-url=http://$(POD_IP):8000",
		"--kv-events=tcp://127.0.0.1:5557", "--kv-replay=tcp://127.0.0.1:5567", "--data-parallel-size=1",
		"--block-size=16", "--router-block-size=16", "--topic=kv")
	e := container(t, s.Spec.Template.Spec, "engine")
	hasArgs(t, e, "--port=8000", "--block-size=16", "--data-parallel-size=1",
		`--kv-events-config={"buffer_steps":10000,"enable_kv_cache_events":true,"endpoint":"tcp://*:5557","publisher":"zmq","replay_endpoint":"tcp://*:5567","topic":"kv"}`)
	for _, name := range []string{"kv-kvrouter-nats-router", "kv-kvrouter-nats-gateway", "kv-kvrouter-nats-workers"} {
		r.secret(t, name)
	}
}

func checkExistingNATS(t *testing.T, r rendered) {
	url := "--nats-url=nats://nats-0.messaging:4222,nats://nats-1.messaging:4222,nats://nats-2.messaging:4222"
	hasArgs(t, container(t, r.deployment(t, router).Spec.Template.Spec, "router"), url, "--stream-replicas=3")
	hasArgs(t, container(t, r.deployment(t, gateway).Spec.Template.Spec, "gateway"), url)
	hasArgs(t, container(t, r.statefulSet(t, engine).Spec.Template.Spec, "bridge"), url)
}

func checkTLS(t *testing.T, r rendered) {
	tls := []string{"--nats-tls-ca=/etc/kvrouter/nats-tls/ca.crt", "--nats-tls-cert=/etc/kvrouter/nats-tls/tls.crt", "--nats-tls-key=/etc/kvrouter/nats-tls/tls.key"}
	for _, pod := range []struct {
		spec corev1.PodSpec
		name string
	}{
		{r.deployment(t, router).Spec.Template.Spec, "router"},
		{r.deployment(t, gateway).Spec.Template.Spec, "gateway"},
		{r.statefulSet(t, engine).Spec.Template.Spec, "bridge"},
	} {
		hasArgs(t, container(t, pod.spec, pod.name), tls...)
		if !slices.ContainsFunc(pod.spec.Volumes, func(v corev1.Volume) bool {
			return v.Secret != nil && v.Secret.SecretName == "nats-client-tls"
		}) {
			t.Errorf("%s pod does not mount the TLS Secret", pod.name)
		}
	}
	hasArgs(t, container(t, r.deployment(t, gateway).Spec.Template.Spec, "gateway"), "--api-key-file=/etc/kvrouter/api-key/api-key")
}

func checkReplicas(t *testing.T, r rendered) {
	for _, d := range []string{router, gateway} {
		if n := *r.deployment(t, d).Spec.Replicas; n != 3 {
			t.Errorf("%s replicas %d, want 3", d, n)
		}
	}
	if n := *r.statefulSet(t, engine).Spec.Replicas; n != 3 {
		t.Errorf("engine replicas %d, want 3", n)
	}
	w := r.secret(t, "kv-kvrouter-nats-workers")
	if len(w.Data) != 3 {
		t.Errorf("workers Secret has %d passwords, want one per engine pod", len(w.Data))
	}
}

func checkDataParallel(t *testing.T, r rendered) {
	s := r.statefulSet(t, engine)
	hasArgs(t, container(t, s.Spec.Template.Spec, "bridge"), "--data-parallel-size=2", "--block-size=32",
		"--router-block-size=32", "--kv-events=tcp://127.0.0.1:6000", "--kv-replay=tcp://127.0.0.1:6100",
		"--engine-url=http://$(POD_IP):8100")
	e := container(t, s.Spec.Template.Spec, "engine")
	hasArgs(t, e, "--data-parallel-size=2", "--tensor-parallel-size=2", "--block-size=32", "--port=8100")
	if q := e.Resources.Limits["nvidia.com/gpu"]; q.Value() != 4 {
		t.Errorf("engine GPUs %s, want dp 2 x tp 2 = 4", q.String())
	}
	hasArgs(t, container(t, r.deployment(t, router).Spec.Template.Spec, "router"), "--block-size=32")
}

// checkAuthConf parses the generated server configuration as nats-server
// does and checks that every user has its role's permissions.
func checkAuthConf(t *testing.T, r rendered) {
	t.Helper()
	m, err := conf.Parse(string(r.secret(t, "kvrouter-nats-auth").Data["auth.conf"]))
	if err != nil {
		t.Fatalf("auth.conf does not parse as NATS configuration: %v", err)
	}
	authz, _ := m["authorization"].(map[string]any)
	users, _ := authz["users"].([]any)
	roles := map[string]string{}
	for _, u := range users {
		um, _ := u.(map[string]any)
		perms, _ := um["permissions"].(map[string]any)
		pub, _ := perms["publish"].(map[string]any)
		allow, _ := pub["allow"].([]any)
		name, _ := um["user"].(string)
		pw, _ := um["password"].(string)
		if len(allow) == 0 || len(pw) < 16 {
			t.Errorf("user %q: %d publish permissions, password of %d bytes", name, len(allow), len(pw))
		}
		roles[name] = fmt.Sprint(allow[0])
	}
	if roles["router"] != "kvr.bookings.*" || roles["gateway"] != "kvr.route.*" || !strings.HasPrefix(roles["kv-kvrouter-engine-0"], "kvr.events.") {
		t.Errorf("users and their first publish permission: %v", roles)
	}
}
