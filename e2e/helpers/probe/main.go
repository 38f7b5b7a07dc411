// Command probe is the e2e smoke test's static helper (standard library only).
//
//	probe serve [ADDR]   HTTP on ADDR (default :8080): "/" answers "<hostname>\n", "/healthz" "ok"
//	probe get URL        GET URL, print the body; exit 1 unless 200
//	probe routes         print this network namespace's IPv4 routes ("DEST/PREFIX [via GW] dev IF")
//	probe kube-api       from inside a pod: call the API server through the `kubernetes`
//	                     Service, at $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT (as
//	                     client-go and kube-rs do) and at https://kubernetes.default.svc, with
//	                     the pod's service account token; verify TLS with the mounted CA;
//	                     print who the API server says we are
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

const saDir = "/var/run/secrets/kubernetes.io/serviceaccount"

func main() {
	log.SetFlags(0)
	if len(os.Args) < 2 {
		log.Fatal("usage: probe serve [ADDR] | get URL | routes | kube-api")
	}
	var err error
	switch os.Args[1] {
	case "serve":
		addr := ":8080"
		if len(os.Args) > 2 {
			addr = os.Args[2]
		}
		err = serve(addr)
	case "get":
		if len(os.Args) != 3 {
			log.Fatal("usage: probe get URL")
		}
		err = get(os.Args[2])
	case "kube-api":
		err = kubeAPI()
	case "routes":
		err = routes()
	default:
		log.Fatalf("probe: unknown command %q", os.Args[1])
	}
	if err != nil {
		log.Fatalf("probe %s: %v", os.Args[1], err)
	}
}

func serve(addr string) error {
	host, _ := os.Hostname()
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		log.Printf("%s %s from %s", r.Method, r.URL.Path, r.RemoteAddr)
		fmt.Fprintln(w, host)
	})
	log.Printf("probe serving on %s as %s", addr, host)
	return http.ListenAndServe(addr, mux)
}

// get fetches url. The timeout leaves room for one retransmitted DNS query: the pod
// resolver waits 5 s before it asks again when a UDP answer is lost, and a smoke check
// must tell a lost packet (slow, then ok) from a broken path (never answers).
func get(url string) error {
	client := http.Client{Timeout: 15 * time.Second}
	started := time.Now()
	resp, err := client.Get(url)
	if err != nil {
		return fmt.Errorf("after %s: %w", time.Since(started).Round(time.Millisecond), err)
	}
	if elapsed := time.Since(started); elapsed > 2*time.Second {
		log.Printf("slow answer from %s: %s", url, elapsed.Round(time.Millisecond))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	os.Stdout.Write(body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}

// routes prints /proc/net/route (an image without ip(8) can still show it has no default route).
func routes() error {
	data, err := os.ReadFile("/proc/net/route")
	if err != nil {
		return err
	}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		dst, err1 := hexIPv4(f[1])
		gw, err2 := hexIPv4(f[2])
		mask, err3 := hexIPv4(f[7])
		if err1 != nil || err2 != nil || err3 != nil {
			return fmt.Errorf("bad /proc/net/route line %q", line)
		}
		ones, _ := net.IPMask(mask.To4()).Size()
		via := ""
		if !gw.Equal(net.IPv4zero) {
			via = " via " + gw.String()
		}
		fmt.Printf("%s/%d%s dev %s\n", dst, ones, via, f[0])
	}
	return nil
}

// hexIPv4 decodes the little-endian hex addresses of /proc/net/route.
func hexIPv4(s string) (net.IP, error) {
	v, err := strconv.ParseUint(s, 16, 32)
	if err != nil {
		return nil, err
	}
	return net.IPv4(byte(v), byte(v>>8), byte(v>>16), byte(v>>24)), nil
}

// kubeAPI posts a SelfSubjectReview, which every authenticated identity may create,
// so the answer proves DNS, the Service, TLS verification and token authentication.
func kubeAPI() error {
	token, err := os.ReadFile(saDir + "/token")
	if err != nil {
		return err
	}
	caPEM, err := os.ReadFile(saDir + "/ca.crt")
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("no certificate in %s/ca.crt", saDir)
	}
	client := http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
	}
	// the address in-cluster clients (client-go, kube-rs) take from the environment, then the DNS name
	hosts := []string{"kubernetes.default.svc"}
	if h, p := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT"); h != "" && p != "" {
		hosts = append([]string{net.JoinHostPort(h, p)}, hosts...)
	}
	for _, host := range hosts {
		user, err := selfSubjectReview(&client, host, token)
		if err != nil {
			return err
		}
		fmt.Printf("https://%s: apiserver says I am %s\n", host, user)
	}
	return nil
}

func selfSubjectReview(client *http.Client, host string, token []byte) (string, error) {
	url := "https://" + host + "/apis/authentication.k8s.io/v1/selfsubjectreviews"
	body := []byte(`{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`)
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+string(bytes.TrimSpace(token)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s: %s", url, resp.Status, answer)
	}
	var review struct {
		Status struct {
			UserInfo struct {
				Username string `json:"username"`
			} `json:"userInfo"`
		} `json:"status"`
	}
	if err := json.Unmarshal(answer, &review); err != nil {
		return "", err
	}
	return review.Status.UserInfo.Username, nil
}
