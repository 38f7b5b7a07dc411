package dev.flightcache.interop;

import io.grpc.ManagedChannel;
import io.grpc.internal.JsonParser;
import io.grpc.netty.GrpcSslContexts;
import io.grpc.netty.NettyChannelBuilder;
import io.netty.channel.ChannelOption;
import io.netty.handler.ssl.SslContextBuilder;
import java.io.File;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * Dials a node with the client settings of docs/failure-model.md ("Client settings"), as
 * close as grpc-java allows them. What differs, and why:
 *
 * <ul>
 *   <li>keepalive: the documented 1 s ping / 1 s timeout. grpc-java raises a keepalive time
 *       below 10 s to 10 s (NettyChannelBuilder's floor), so a call on a connection to a
 *       frozen node is ended by the keepalive only after ~10 s without a read + the 1 s ping
 *       timeout, not ~2 s (measured: docs/clients.md, "Java").
 *   <li>the service config is the same file (docs/examples/grpc-service-config.json): DoGet
 *       and DoPut wait for a connection and are tried again on UNAVAILABLE, 5 tries, 50 ms
 *       doubling to 400 ms. A call is buffered up to 256 KiB to be sent again, as gRPC-core
 *       does (grpc-java's own default is 1 MiB).
 *   <li>reconnect backoff: grpc-java's public API does not set it (1 s first, 120 s at most,
 *       where the documented one is 100 ms to 1 s); the 1 s connect timeout is set.
 * </ul>
 */
final class Channels {
  /** Names the file of the gRPC service config; ./run points it at the repository's copy. */
  static final String SERVICE_CONFIG_ENV = "FLIGHTCACHE_GRPC_SERVICE_CONFIG";

  private Channels() {}

  /**
   * A channel to host:port: TLS trusting FLIGHTCACHE_TLS_CA when it is set (presenting
   * FLIGHTCACHE_TLS_CLIENT_CERT / _KEY when those are set too), plaintext otherwise; the
   * variables e2e/tests/flight_client.py reads. Netty reads an unencrypted PKCS#8 key PEM
   * ("BEGIN PRIVATE KEY", what e2e/tests/certs.py writes); ./run converts others first.
   */
  static ManagedChannel dial(String host, int port) throws IOException {
    NettyChannelBuilder builder =
        NettyChannelBuilder.forAddress(host, port)
            .defaultServiceConfig(serviceConfig())
            // Only our service config applies, never one from the name resolver.
            .disableServiceConfigLookUp()
            .enableRetry()
            .perRpcBufferLimit(256 * 1024)
            .keepAliveTime(1, TimeUnit.SECONDS) // raised to 10 s by grpc-java (above)
            .keepAliveTimeout(1, TimeUnit.SECONDS)
            .withOption(ChannelOption.CONNECT_TIMEOUT_MILLIS, 1000)
            // What Arrow's own FlightClient.Builder sets: the node keeps DoGet messages under
            // 4 MiB, a larger limit costs nothing.
            .maxInboundMessageSize(Integer.MAX_VALUE);
    String ca = System.getenv("FLIGHTCACHE_TLS_CA");
    if (ca == null || ca.isEmpty()) {
      return builder.usePlaintext().build();
    }
    SslContextBuilder tls = GrpcSslContexts.forClient().trustManager(new File(ca));
    String cert = System.getenv("FLIGHTCACHE_TLS_CLIENT_CERT");
    String key = System.getenv("FLIGHTCACHE_TLS_CLIENT_KEY");
    if (cert != null && !cert.isEmpty() && key != null && !key.isEmpty()) {
      tls.keyManager(new File(cert), new File(key));
    }
    // The server name verified is the host dialed (a DNS name or an IP SAN).
    return builder.useTransportSecurity().sslContext(tls.build()).build();
  }

  /** Reads the service config JSON into the map grpc-java takes. */
  @SuppressWarnings("unchecked")
  private static Map<String, ?> serviceConfig() throws IOException {
    String path = System.getenv(SERVICE_CONFIG_ENV);
    if (path == null || path.isEmpty()) {
      throw new IOException(
          SERVICE_CONFIG_ENV
              + " is not set: point it at docs/examples/grpc-service-config.json"
              + " (e2e/interop/java/run does)");
    }
    // grpc-java's own JSON reader: it yields the Map/List/Double shapes its service config
    // parser expects, with no JSON library added to the jar.
    return (Map<String, ?>)
        JsonParser.parse(Files.readString(Path.of(path), StandardCharsets.UTF_8));
  }
}
