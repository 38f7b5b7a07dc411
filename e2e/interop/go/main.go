// Command flightcache-interop-go is an Arrow Go Flight client of a FlightCache node, for
// the interoperability tests of e2e/interop (docs/clients.md). It speaks the node's plain
// Flight conventions, as pyarrow does in e2e/tests/flight_client.py:
//
//	put HOST PORT TOKEN KEY IN.arrow    DoPut of an Arrow IPC file under KEY
//	get HOST PORT TOKEN KEY OUT.arrow   DoGet of KEY, written as an Arrow IPC file
//	probe-frozen HOST PORT TOKEN KEY    time calls on an open connection to a node
//	                                    stopped meanwhile (e2e/interop/frozen-node)
//
// put and get print one JSON line: {"ok":true,"rows":N}, or for get {"ok":false,
// "missing":true} when the node answers NOT_FOUND (the key is not cached). Any other
// failure exits 1 with "<verb> <key>: <gRPC code>: <message>" on stderr; a usage error
// exits 2. TOKEN "-" sends no credential. TLS: conn.go.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/apache/arrow-go/v18/arrow/flight"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// ticketPrefix is the version-1 ticket of a path key: magic "FCT", version 1, kind 'P'
// (docs/cache-node.md, "Keys and tickets"). A hit is one DoGet of it.
const ticketPrefix = "FCT\x01P"

const usage = `usage: flightcache-interop-go put HOST PORT TOKEN KEY IN.arrow
       flightcache-interop-go get HOST PORT TOKEN KEY OUT.arrow
       flightcache-interop-go probe-frozen HOST PORT TOKEN KEY`

func main() {
	args := os.Args[1:]
	arity := map[string]int{"put": 6, "get": 6, "probe-frozen": 5}
	if len(args) == 0 || arity[args[0]] != len(args) {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	verb, host, port, token, key := args[0], args[1], args[2], args[3], args[4]
	conn, err := dial(host, port)
	if err != nil {
		fail(verb, key, err)
	}
	defer conn.Close()
	client := flight.NewFlightServiceClient(conn)
	switch verb {
	case "put":
		rows, err := put(client, token, key, args[5])
		if err != nil {
			fail(verb, key, err)
		}
		fmt.Printf("{\"ok\":true,\"rows\":%d}\n", rows)
	case "get":
		rows, err := get(client, token, key, args[5])
		if status.Code(err) == codes.NotFound {
			fmt.Println(`{"ok":false,"missing":true}`)
			return
		}
		if err != nil {
			fail(verb, key, err)
		}
		fmt.Printf("{\"ok\":true,\"rows\":%d}\n", rows)
	case "probe-frozen":
		if err := probeFrozen(client, token, key); err != nil {
			fail(verb, key, err)
		}
	}
}

// fail prints the error with its gRPC status code (UNKNOWN for a local error such as an
// unreadable file) and exits 1. Exits skip deferred calls; the process holds nothing
// that outlives it.
func fail(verb, key string, err error) {
	if st, ok := status.FromError(err); ok {
		fmt.Fprintf(os.Stderr, "%s %s: %s: %s\n", verb, key, strings.ToUpper(codeName(st.Code())), st.Message())
	} else {
		fmt.Fprintf(os.Stderr, "%s %s: %v\n", verb, key, err)
	}
	os.Exit(1)
}

// codeName is the canonical gRPC name (NOT_FOUND), as pyarrow and grpc-java print it;
// grpc-go's String() is CamelCase (NotFound).
func codeName(c codes.Code) string {
	names := map[codes.Code]string{
		codes.OK: "OK", codes.Canceled: "CANCELLED", codes.Unknown: "UNKNOWN",
		codes.InvalidArgument: "INVALID_ARGUMENT", codes.DeadlineExceeded: "DEADLINE_EXCEEDED",
		codes.NotFound: "NOT_FOUND", codes.AlreadyExists: "ALREADY_EXISTS",
		codes.PermissionDenied: "PERMISSION_DENIED", codes.ResourceExhausted: "RESOURCE_EXHAUSTED",
		codes.FailedPrecondition: "FAILED_PRECONDITION", codes.Aborted: "ABORTED",
		codes.OutOfRange: "OUT_OF_RANGE", codes.Unimplemented: "UNIMPLEMENTED",
		codes.Internal: "INTERNAL", codes.Unavailable: "UNAVAILABLE", codes.DataLoss: "DATA_LOSS",
		codes.Unauthenticated: "UNAUTHENTICATED",
	}
	if name, ok := names[c]; ok {
		return name
	}
	return c.String()
}

// callContext is one call's context: its deadline and the client token as
// `authorization: Bearer <token>` (the node needs no Handshake).
func callContext(token string) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	if token != "-" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	return ctx, cancel
}

// put sends the batches of the IPC file at path as KEY: the first message carries the
// PATH descriptor (one segment per "/" part, as pyarrow's for_path(*key.split("/"))) and
// the schema. Returns the rows the node stored, from its PutResult.
func put(client flight.FlightServiceClient, token, key, path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	mem := memory.NewGoAllocator()
	file, err := ipc.NewFileReader(f, ipc.WithAllocator(mem))
	if err != nil {
		return 0, fmt.Errorf("reading %s as an Arrow IPC file: %w", path, err)
	}
	defer file.Close()

	ctx, cancel := callContext(token)
	defer cancel()
	stream, err := client.DoPut(ctx)
	if err != nil {
		return 0, err
	}
	writer := flight.NewRecordWriter(stream, ipc.WithSchema(file.Schema()), ipc.WithAllocator(mem))
	writer.SetFlightDescriptor(&flight.FlightDescriptor{Type: flight.DescriptorPATH, Path: strings.Split(key, "/")})
	for i := 0; i < file.NumRecords(); i++ {
		batch, err := file.RecordBatch(i)
		if err != nil {
			return 0, fmt.Errorf("reading batch %d of %s: %w", i, path, err)
		}
		if err := writer.Write(batch); err != nil {
			// A refused call (a wrong token, an oversized entry) makes Send answer io.EOF;
			// its status comes from Recv below.
			if errors.Is(err, io.EOF) {
				break
			}
			return 0, err
		}
	}
	// Close sends the schema even when the file has no batches: an empty result.
	if err := writer.Close(); err != nil && !errors.Is(err, io.EOF) {
		return 0, err
	}
	if err := stream.CloseSend(); err != nil {
		return 0, err
	}
	result, err := stream.Recv()
	if err != nil {
		return 0, err
	}
	// Read to the end: the call's own status comes after its answer.
	if _, err := stream.Recv(); err != io.EOF {
		if err == nil {
			err = errors.New("the node sent more than one PutResult")
		}
		return 0, err
	}
	var answer struct {
		Rows *int64 `json:"rows"`
	}
	if err := json.Unmarshal(result.AppMetadata, &answer); err != nil || answer.Rows == nil {
		return 0, fmt.Errorf("the PutResult's app_metadata is not the node's JSON: %q", result.AppMetadata)
	}
	return *answer.Rows, nil
}

// get reads KEY with one DoGet of its ticket and writes the stream as an Arrow IPC file
// at path (through a temporary file, so a failed read leaves no file). Returns the rows
// read; a NOT_FOUND from the node is returned as the gRPC error it is.
func get(client flight.FlightServiceClient, token, key, path string) (int64, error) {
	ctx, cancel := callContext(token)
	defer cancel()
	stream, err := client.DoGet(ctx, &flight.Ticket{Ticket: []byte(ticketPrefix + key)})
	if err != nil {
		return 0, err
	}
	mem := memory.NewGoAllocator()
	// The first message (the schema, or the node's error) is read here.
	reader, err := flight.NewRecordReader(stream, ipc.WithAllocator(mem))
	if err != nil {
		return 0, err
	}
	defer reader.Release()

	tmp, err := os.CreateTemp(filepath.Dir(path), ".interop-get-*")
	if err != nil {
		return 0, err
	}
	defer os.Remove(tmp.Name()) // gone after the rename; removes a failed read's file
	defer tmp.Close()
	writer, err := ipc.NewFileWriter(tmp, ipc.WithSchema(reader.Schema()), ipc.WithAllocator(mem))
	if err != nil {
		return 0, err
	}
	var rows int64
	for reader.Next() {
		batch := reader.RecordBatch()
		rows += batch.NumRows()
		if err := writer.Write(batch); err != nil {
			return 0, err
		}
	}
	if err := reader.Err(); err != nil && !errors.Is(err, io.EOF) {
		return 0, err
	}
	if err := writer.Close(); err != nil {
		return 0, err
	}
	if err := tmp.Close(); err != nil {
		return 0, err
	}
	return rows, os.Rename(tmp.Name(), path)
}

// probeFrozen measures how a call on an open connection ends when the node stops
// answering (e2e/interop/frozen-node drives it): it reads KEY once (the connection is
// then open), prints {"ready":true}, waits for a line on stdin (sent once the node is
// stopped), then starts at once on that connection a DoAction "ping" (not in the service
// config: no retry, no wait for a connection, so it ends when the connection does) and a
// DoGet of KEY (retried by the service config), and prints how long each took and its
// status code.
func probeFrozen(client flight.FlightServiceClient, token, key string) error {
	dir, err := os.MkdirTemp("", "interop-probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if _, err := get(client, token, key, filepath.Join(dir, "warm.arrow")); err != nil {
		return err
	}
	fmt.Println(`{"ready":true}`)
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return fmt.Errorf("waiting for the go-ahead on stdin: %w", err)
	}
	type outcome struct {
		ms   int64
		code string
	}
	var ping, read outcome
	var wg sync.WaitGroup
	started := time.Now()
	wg.Add(2)
	go func() {
		defer wg.Done()
		ctx, cancel := callContext(token)
		defer cancel()
		err := func() error {
			results, err := client.DoAction(ctx, &flight.Action{Type: "ping"})
			if err != nil {
				return err
			}
			for {
				if _, err := results.Recv(); err != nil {
					if err == io.EOF {
						return nil
					}
					return err
				}
			}
		}()
		ping = outcome{time.Since(started).Milliseconds(), codeName(status.Code(err))}
	}()
	go func() {
		defer wg.Done()
		_, err := get(client, token, key, filepath.Join(dir, "probe.arrow"))
		read = outcome{time.Since(started).Milliseconds(), codeName(status.Code(err))}
	}()
	wg.Wait()
	fmt.Printf("{\"ping\":{\"ms\":%d,\"code\":%q},\"get\":{\"ms\":%d,\"code\":%q}}\n", ping.ms, ping.code, read.ms, read.code)
	return nil
}
