package dev.flightcache.interop;

import io.grpc.ManagedChannel;
import io.grpc.Status;
import io.grpc.StatusException;
import io.grpc.StatusRuntimeException;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.util.Iterator;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.arrow.flight.Action;
import org.apache.arrow.flight.CallOption;
import org.apache.arrow.flight.CallOptions;
import org.apache.arrow.flight.FlightCallHeaders;
import org.apache.arrow.flight.FlightClient;
import org.apache.arrow.flight.FlightDescriptor;
import org.apache.arrow.flight.FlightGrpcUtils;
import org.apache.arrow.flight.FlightRuntimeException;
import org.apache.arrow.flight.FlightStream;
import org.apache.arrow.flight.HeaderCallOption;
import org.apache.arrow.flight.PutResult;
import org.apache.arrow.flight.Result;
import org.apache.arrow.flight.SyncPutListener;
import org.apache.arrow.flight.Ticket;
import org.apache.arrow.flight.grpc.StatusUtils;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.ipc.ArrowFileReader;
import org.apache.arrow.vector.ipc.ArrowFileWriter;
import org.apache.arrow.vector.ipc.message.ArrowBlock;

/**
 * An Arrow Java Flight client of a FlightCache node, for the interoperability tests of
 * e2e/interop. It speaks the node's plain Flight conventions, as pyarrow does in
 * e2e/tests/flight_client.py:
 *
 * <pre>
 *   put HOST PORT TOKEN KEY IN.arrow    DoPut of an Arrow IPC file under KEY
 *   get HOST PORT TOKEN KEY OUT.arrow   DoGet of KEY, written as an Arrow IPC file
 *   probe-frozen HOST PORT TOKEN KEY    time calls on an open connection to a node
 *                                       stopped meanwhile (e2e/interop/frozen-node)
 * </pre>
 *
 * put and get print one JSON line: {"ok":true,"rows":N}, or for get
 * {"ok":false,"missing":true} when the node answers NOT_FOUND (the key is not cached). Any
 * other failure exits 1 with "VERB KEY: GRPC_CODE: message" on stderr; a usage error exits 2.
 * TOKEN "-" sends no credential. TLS and the gRPC settings: {@link Channels}.
 */
public final class Main {
  /** Bounds each call, the whole stream of a DoGet or DoPut included (as flight_client.py). */
  private static final long CALL_TIMEOUT_SECONDS = 20;

  /** The version-1 ticket of a path key: "FCT", version 1, kind 'P' (cache-node.md). */
  private static final String TICKET_PREFIX = "FCT\u0001P";

  private static final Pattern ROWS = Pattern.compile("\"rows\"\\s*:\\s*(\\d+)");

  private static final String USAGE =
      "usage: flightcache-interop-java put HOST PORT TOKEN KEY IN.arrow\n"
          + "       flightcache-interop-java get HOST PORT TOKEN KEY OUT.arrow\n"
          + "       flightcache-interop-java probe-frozen HOST PORT TOKEN KEY";

  private Main() {}

  public static void main(String[] args) {
    int arity =
        args.length == 0
            ? -1
            : switch (args[0]) {
              case "put", "get" -> 6;
              case "probe-frozen" -> 5;
              default -> -1;
            };
    if (arity != args.length) {
      System.err.println(USAGE);
      System.exit(2);
    }
    String verb = args[0];
    String key = args[4];
    int code;
    try {
      code = run(args);
    } catch (Exception e) {
      System.err.println(verb + " " + key + ": " + describe(e));
      code = 1;
    }
    System.out.flush();
    // Exit at once: grpc-java's and Netty's threads are daemons or shut down already, but
    // an exit here never waits on one.
    System.exit(code);
  }

  private static int run(String[] args) throws Exception {
    String verb = args[0];
    String token = args[3];
    String key = args[4];
    ManagedChannel channel = Channels.dial(args[1], Integer.parseInt(args[2]));
    try (BufferAllocator allocator = new RootAllocator();
        FlightClient client = FlightGrpcUtils.createFlightClient(allocator, channel)) {
      switch (verb) {
        case "put" -> System.out.println(
            "{\"ok\":true,\"rows\":" + put(client, allocator, token, key, Path.of(args[5])) + "}");
        case "get" -> {
          try {
            long rows = get(client, token, key, Path.of(args[5]));
            System.out.println("{\"ok\":true,\"rows\":" + rows + "}");
          } catch (FlightRuntimeException e) {
            if (grpcStatus(e).getCode() != Status.Code.NOT_FOUND) {
              throw e;
            }
            System.out.println("{\"ok\":false,\"missing\":true}");
          }
        }
        default -> probeFrozen(client, token, key);
      }
    } finally {
      channel.shutdownNow();
      channel.awaitTermination(5, TimeUnit.SECONDS);
    }
    return 0;
  }

  /** Each call's options: its deadline and the token as `authorization: Bearer <token>`. */
  private static CallOption[] callOptions(String token) {
    CallOption deadline = CallOptions.timeout(CALL_TIMEOUT_SECONDS, TimeUnit.SECONDS);
    if (token.equals("-")) {
      return new CallOption[] {deadline};
    }
    FlightCallHeaders headers = new FlightCallHeaders();
    headers.insert("authorization", "Bearer " + token);
    return new CallOption[] {deadline, new HeaderCallOption(headers)};
  }

  /**
   * Sends the batches of the IPC file at path as KEY: the first message carries the PATH
   * descriptor (one segment per "/" part, as pyarrow's for_path(*key.split("/"))) and the
   * schema. Returns the rows the node stored, from its PutResult's JSON.
   */
  private static long put(
      FlightClient client, BufferAllocator allocator, String token, String key, Path path)
      throws Exception {
    try (FileChannel in = FileChannel.open(path, StandardOpenOption.READ);
        ArrowFileReader file = new ArrowFileReader(in, allocator);
        SyncPutListener listener = new SyncPutListener()) {
      VectorSchemaRoot root = file.getVectorSchemaRoot();
      FlightDescriptor descriptor = FlightDescriptor.path(key.split("/", -1));
      FlightClient.ClientStreamListener stream =
          client.startPut(descriptor, root, file, listener, callOptions(token));
      for (ArrowBlock block : file.getRecordBlocks()) {
        file.loadRecordBatch(block);
        // Serialises the root's current batch; the next load replaces the root's buffers
        // without touching those the message holds.
        stream.putNext();
      }
      stream.completed();
      stream.getResult(); // the call's status: throws FlightRuntimeException on an error
      try (PutResult result = listener.poll(0, TimeUnit.SECONDS)) {
        if (result == null) {
          throw new IllegalStateException("the node ended the put without a PutResult");
        }
        ArrowBuf meta = result.getApplicationMetadata();
        byte[] bytes = new byte[meta == null ? 0 : (int) meta.readableBytes()];
        if (meta != null) {
          meta.getBytes(0, bytes);
        }
        String json = new String(bytes, StandardCharsets.UTF_8);
        Matcher rows = ROWS.matcher(json);
        if (!rows.find()) {
          throw new IllegalStateException("the PutResult's app_metadata is not the node's JSON: " + json);
        }
        return Long.parseLong(rows.group(1));
      }
    }
  }

  /**
   * Reads KEY with one DoGet of its ticket and writes the stream as an Arrow IPC file at path
   * (through a temporary file, so a failed read leaves none). Returns the rows read; the
   * node's NOT_FOUND surfaces as the FlightRuntimeException it is.
   */
  private static long get(FlightClient client, String token, String key, Path path)
      throws Exception {
    Ticket ticket = new Ticket((TICKET_PREFIX + key).getBytes(StandardCharsets.UTF_8));
    Path dir = path.toAbsolutePath().getParent();
    Path tmp = Files.createTempFile(dir, ".interop-get-", ".arrow");
    try (FlightStream stream = client.getStream(ticket, callOptions(token))) {
      // Waits for the first message: the schema, or the node's error.
      VectorSchemaRoot root = stream.getRoot();
      long rows = 0;
      try (FileChannel out = FileChannel.open(tmp, StandardOpenOption.WRITE);
          ArrowFileWriter writer = new ArrowFileWriter(root, stream.getDictionaryProvider(), out)) {
        writer.start();
        while (stream.next()) {
          rows += root.getRowCount();
          writer.writeBatch();
        }
        writer.end();
      }
      Files.move(tmp, path, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
      return rows;
    } finally {
      Files.deleteIfExists(tmp);
    }
  }

  /**
   * Measures how a call on an open connection ends when the node stops answering
   * (e2e/interop/frozen-node drives it): reads KEY once (the connection is then open),
   * prints {"ready":true}, waits for a line on stdin (sent once the node is stopped), then
   * starts at once on that connection a DoAction "ping" (not in the service config: no
   * retry, no wait for a connection, so it ends when the connection does) and a DoGet of
   * KEY (retried by the service config), and prints how long each took and its code.
   */
  private static void probeFrozen(FlightClient client, String token, String key) throws Exception {
    Path dir = Files.createTempDirectory("interop-probe-");
    try {
      get(client, token, key, dir.resolve("warm.arrow"));
      System.out.println("{\"ready\":true}");
      System.out.flush();
      if (new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8)).readLine()
          == null) {
        throw new IllegalStateException("stdin closed before the go-ahead");
      }
      long started = System.nanoTime();
      CompletableFuture<String> ping =
          CompletableFuture.supplyAsync(
              () ->
                  timed(
                      started,
                      () -> {
                        Iterator<Result> results =
                            client.doAction(new Action("ping"), callOptions(token));
                        while (results.hasNext()) {
                          results.next();
                        }
                      }));
      CompletableFuture<String> read =
          CompletableFuture.supplyAsync(
              () -> timed(started, () -> get(client, token, key, dir.resolve("probe.arrow"))));
      System.out.println("{\"ping\":" + ping.get() + ",\"get\":" + read.get() + "}");
    } finally {
      try (var files = Files.list(dir)) {
        for (Path p : (Iterable<Path>) files::iterator) {
          Files.deleteIfExists(p);
        }
      }
      Files.deleteIfExists(dir);
    }
  }

  private interface Call {
    void run() throws Exception;
  }

  private static String timed(long started, Call call) {
    String code = "OK";
    try {
      call.run();
    } catch (Exception e) {
      code = grpcStatus(e).getCode().name();
    }
    long ms = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - started);
    return "{\"ms\":" + ms + ",\"code\":\"" + code + "\"}";
  }

  /**
   * The gRPC status of a failure: the node's own (Arrow keeps grpc-java's exception as the
   * cause; its FlightStatusCode folds some codes, ABORTED into INTERNAL for one), else the
   * Flight code mapped back, else UNKNOWN (a local error).
   */
  private static Status grpcStatus(Throwable e) {
    Status status = Status.fromThrowable(e);
    if (status.getCode() == Status.Code.UNKNOWN && e instanceof FlightRuntimeException f) {
      return StatusUtils.toGrpcStatusCode(f.status().code())
          .toStatus()
          .withDescription(f.status().description());
    }
    return status;
  }

  /** "CODE: message" for a gRPC failure, the exception itself for a local one. */
  private static String describe(Exception e) {
    for (Throwable t = e; t != null; t = t.getCause()) {
      if (t instanceof StatusRuntimeException
          || t instanceof StatusException
          || t instanceof FlightRuntimeException) {
        Status status = grpcStatus(e);
        // grpc-java appends a connect failure's stack trace to the description: the first
        // line names the failure (e.g. "Connection refused: /127.0.0.1:50051").
        String message = String.valueOf(status.getDescription()).lines().findFirst().orElse("");
        return status.getCode().name() + ": " + message;
      }
    }
    return e.toString();
  }
}
