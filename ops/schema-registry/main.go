// A Confluent-compatible Schema Registry for tests and trials: franz-go's
// in-memory srfake server on a port. Nothing is kept across restarts.
//
//	schema-registry [-addr 127.0.0.1:0] [-auth 'Basic dXNlcjpwYXNz'] [-seed schemas.json]
//	                [-cert server.pem -key server.key]
//
// -cert and -key serve HTTPS instead of HTTP.
// -seed registers, in order, the schemas of a JSON array of {"subject", "schema"}
// objects before it listens (ids count from 1 in that order): a restart that
// keeps the ids, as a registry that stores its state would. It prints the
// address it listens on as its first line of output, then serves until it is
// killed. Built by pipeline/tools/registry_local.py (./run setup).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"

	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
)

type seedEntry struct {
	Subject string `json:"subject"`
	Schema  string `json:"schema"`
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "schema-registry:", err)
	os.Exit(1)
}

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "host:port to listen on (port 0: a free one)")
	auth := flag.String("auth", "", "if set, the exact Authorization header every request must carry")
	cert := flag.String("cert", "", "PEM certificate: serve HTTPS (with -key)")
	key := flag.String("key", "", "PEM private key of -cert")
	seed := flag.String("seed", "", "JSON file: [{\"subject\": ..., \"schema\": ...}] registered in order first")
	flag.Parse()
	var opts []srfake.Option
	if *auth != "" {
		opts = append(opts, srfake.WithAuth(*auth))
	}
	registry := srfake.NewRegistry(opts...)
	if *seed != "" {
		raw, err := os.ReadFile(*seed)
		if err != nil {
			fail(err)
		}
		var entries []seedEntry
		if err := json.Unmarshal(raw, &entries); err != nil {
			fail(err)
		}
		for _, e := range entries {
			if _, _, err := registry.RegisterSchema(e.Subject, sr.Schema{Schema: e.Schema}); err != nil {
				fail(err)
			}
		}
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fail(err)
	}
	fmt.Println(ln.Addr().String())
	if *cert != "" {
		err = http.ServeTLS(ln, registry.Handler(), *cert, *key)
	} else {
		err = http.Serve(ln, registry.Handler())
	}
	fail(err)
}
