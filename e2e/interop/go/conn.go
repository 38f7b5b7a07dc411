package main

// Dialing a node with the client settings of docs/failure-model.md ("Client settings"),
// as close as grpc-go allows them. What differs, and why:
//
//   - keepalive: the documented 1 s ping / 1 s timeout. grpc-go raises a client keepalive
//     time below 10 s to 10 s (internal.KeepaliveMinPingTime, not settable outside grpc),
//     so a call on a connection to a frozen node is ended by the keepalive only after
//     ~10 s of silence + 1 s ping timeout, not ~2 s (measured: docs/clients.md, "Go").
//   - the service config is the same file (docs/examples/grpc-service-config.json): DoGet
//     and DoPut wait for a connection and are tried again on UNAVAILABLE, 5 tries, 50 ms
//     doubling to 400 ms. grpc-go buffers up to 256 KiB of a call to send it again, as
//     gRPC-core does.
//   - reconnect backoff 100 ms to 1 s and a 1 s connect timeout (grpc-go's
//     MinConnectTimeout, which also bounds the wait for the server's HTTP/2 SETTINGS).
//
// Every call has its own deadline (callTimeout), set by the caller's context.

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"math"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
)

// callTimeout bounds each call, the whole stream of a DoGet or DoPut included; the same
// 20 s as e2e/tests/flight_client.py.
const callTimeout = 20 * time.Second

// serviceConfigEnv names the file holding the gRPC service config; ./run points it at
// docs/examples/grpc-service-config.json so there is one copy of the policy.
const serviceConfigEnv = "FLIGHTCACHE_GRPC_SERVICE_CONFIG"

// dial opens a client connection to host:port: TLS trusting FLIGHTCACHE_TLS_CA when it is
// set (presenting FLIGHTCACHE_TLS_CLIENT_CERT / _KEY when those are set too, for a pool
// with clientAuth: required), plaintext otherwise; the variables of
// e2e/tests/flight_client.py.
func dial(host, port string) (*grpc.ClientConn, error) {
	serviceConfigPath := os.Getenv(serviceConfigEnv)
	if serviceConfigPath == "" {
		return nil, fmt.Errorf("%s is not set: point it at docs/examples/grpc-service-config.json (e2e/interop/go/run does)", serviceConfigEnv)
	}
	serviceConfig, err := os.ReadFile(serviceConfigPath)
	if err != nil {
		return nil, fmt.Errorf("reading the service config: %w", err)
	}
	creds, err := transportCredentials()
	if err != nil {
		return nil, err
	}
	return grpc.NewClient(net.JoinHostPort(host, port),
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultServiceConfig(string(serviceConfig)),
		// Only our service config applies, never one from a DNS TXT record.
		grpc.WithDisableServiceConfig(),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time:    1 * time.Second, // raised to 10 s by grpc-go (above)
			Timeout: 1 * time.Second,
		}),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{
				BaseDelay:  100 * time.Millisecond,
				Multiplier: backoff.DefaultConfig.Multiplier,
				Jitter:     backoff.DefaultConfig.Jitter,
				MaxDelay:   1 * time.Second,
			},
			MinConnectTimeout: 1 * time.Second,
		}),
		// The node keeps each DoGet message under gRPC's 4 MiB default; a larger limit
		// costs nothing and matches what Arrow Java's FlightClient sets.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32)),
	)
}

func transportCredentials() (credentials.TransportCredentials, error) {
	caPath := os.Getenv("FLIGHTCACHE_TLS_CA")
	if caPath == "" {
		return insecure.NewCredentials(), nil
	}
	ca, err := os.ReadFile(caPath)
	if err != nil {
		return nil, fmt.Errorf("reading FLIGHTCACHE_TLS_CA: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("FLIGHTCACHE_TLS_CA %s holds no PEM certificate", caPath)
	}
	config := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	certPath, keyPath := os.Getenv("FLIGHTCACHE_TLS_CLIENT_CERT"), os.Getenv("FLIGHTCACHE_TLS_CLIENT_KEY")
	if certPath != "" && keyPath != "" {
		// Go reads PKCS#8, PKCS#1 and SEC 1 (EC) key PEMs alike: no conversion.
		pair, err := tls.LoadX509KeyPair(certPath, keyPath)
		if err != nil {
			return nil, fmt.Errorf("reading the client certificate: %w", err)
		}
		config.Certificates = []tls.Certificate{pair}
	}
	// grpc-go takes the server name to verify from the address (a DNS name or an IP SAN).
	return credentials.NewTLS(config), nil
}
