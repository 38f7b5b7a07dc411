//! A direct DNS lookup of the advertised name: one A or AAAA question over UDP to the
//! cluster's nameservers, answered by DNS alone.
//!
//! Why not the system resolver: in a pod, the kubelet writes the pod's own name into
//! `/etc/hosts`, and glibc consults that file before DNS. The pod's own lookup then
//! succeeds at once, while its peers — which have no such line — still get NXDOMAIN or
//! the previous pod's IP from the cluster DNS. Readiness must see what the peers see.
//!
//! Bounded: one question, answers read into a 1,232-byte buffer (the EDNS-safe size),
//! every offset checked, at most [`PER_SERVER_TIMEOUT`] per nameserver, only datagrams
//! from the nameserver asked (a connected socket) and with the question's ID count.
//!
//! Owns: the DNS question and the parsing of its answer. Must not import any other
//! module of the node (a leaf of `readiness`); its only I/O is the UDP exchange.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use tokio::net::UdpSocket;

/// Longest one nameserver may take to answer before the next one is asked.
pub const PER_SERVER_TIMEOUT: Duration = Duration::from_secs(1);
/// Largest answer read (a pod's name has one or two records; larger answers are cut).
const MAX_MESSAGE: usize = 1232;
/// At most this many nameservers are asked, as glibc does (`MAXNS`).
const MAX_NAMESERVERS: usize = 3;

const TYPE_A: u16 = 1;
const TYPE_AAAA: u16 = 28;
const CLASS_IN: u16 = 1;
const RCODE_NXDOMAIN: u16 = 3;

/// Which address family to ask for: the pod IP's (A without one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// IPv4 (A records).
    V4,
    /// IPv6 (AAAA records).
    V6,
}

impl Family {
    /// The family of `ip`, or IPv4 when there is none.
    pub fn of(ip: Option<IpAddr>) -> Self {
        match ip {
            Some(IpAddr::V6(_)) => Self::V6,
            _ => Self::V4,
        }
    }

    fn record_type(self) -> u16 {
        match self {
            Self::V4 => TYPE_A,
            Self::V6 => TYPE_AAAA,
        }
    }
}

/// The nameservers of a `resolv.conf` text (port 53), at most three, in order.
pub fn nameservers(resolv_conf: &str) -> Vec<SocketAddr> {
    resolv_conf
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some("nameserver")).then(|| words.next())?
        })
        // A scoped IPv6 address (fe80::1%eth0) is not supported here; skip it.
        .filter_map(|address| address.parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .take(MAX_NAMESERVERS)
        .collect()
}

/// The nameservers of `/etc/resolv.conf`.
///
/// # Errors
/// The file cannot be read, or names no nameserver.
pub fn system_nameservers() -> io::Result<Vec<SocketAddr>> {
    let text = std::fs::read_to_string("/etc/resolv.conf")?;
    let servers = nameservers(&text);
    if servers.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "/etc/resolv.conf names no nameserver",
        ));
    }
    Ok(servers)
}

/// Asks `servers` in turn for `host`'s addresses of `family`. NXDOMAIN and an answer
/// without addresses are final; a timeout or a failed server moves on to the next.
///
/// # Errors
/// `NotFound` for NXDOMAIN or no address; the last server's error otherwise.
pub async fn lookup(host: &str, family: Family, servers: &[SocketAddr]) -> io::Result<Vec<IpAddr>> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no nameserver to ask");
    for &server in servers {
        match tokio::time::timeout(PER_SERVER_TIMEOUT, ask(host, family, server)).await {
            Ok(Ok(ips)) => return Ok(ips),
            Ok(Err(err)) if err.kind() == io::ErrorKind::NotFound => return Err(err),
            Ok(Err(err)) => last = err,
            Err(_) => {
                last = io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{server} did not answer within {PER_SERVER_TIMEOUT:?}"),
                );
            }
        }
    }
    Err(last)
}

async fn ask(host: &str, family: Family, server: SocketAddr) -> io::Result<Vec<IpAddr>> {
    let id = question_id();
    let query = encode_query(id, host, family.record_type())?;
    let local: SocketAddr = match server {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(local).await?;
    socket.connect(server).await?;
    socket.send(&query).await?;
    let mut buffer = vec![0_u8; MAX_MESSAGE];
    loop {
        let len = socket.recv(&mut buffer).await?;
        let message = buffer.get(..len).unwrap_or_default();
        // A late answer to an earlier question (or noise): keep waiting for ours.
        if let Some(answer) = decode_answer(id, family.record_type(), message)? {
            return answer;
        }
    }
}

/// An unpredictable question ID (std's per-instance random hash keys; the ID only has
/// to tell this question's answer from stray datagrams).
fn question_id() -> u16 {
    use std::hash::BuildHasher;
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    let [low, high, ..] = std::collections::hash_map::RandomState::new()
        .hash_one(seed)
        .to_le_bytes();
    u16::from_le_bytes([low, high])
}

/// One recursive question for `host` (absolute: no search domains) of type `qtype`.
fn encode_query(id: u16, host: &str, qtype: u16) -> io::Result<Vec<u8>> {
    let invalid =
        |why: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("{host:?} {why}"));
    let name = host.strip_suffix('.').unwrap_or(host);
    if name.is_empty() || name.len() > 253 {
        return Err(invalid("is not a DNS name"));
    }
    let mut query = Vec::with_capacity(18 + name.len());
    query.extend_from_slice(&id.to_be_bytes());
    query.extend_from_slice(&0x0100_u16.to_be_bytes()); // standard query, recursion desired
    query.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]); // one question
    for label in name.split('.') {
        let len = u8::try_from(label.len())
            .ok()
            .filter(|len| (1..=63).contains(len))
            .ok_or_else(|| invalid("has an empty or over-long label"))?;
        query.push(len);
        query.extend_from_slice(label.as_bytes());
    }
    query.push(0);
    query.extend_from_slice(&qtype.to_be_bytes());
    query.extend_from_slice(&CLASS_IN.to_be_bytes());
    Ok(query)
}

/// Reads a DNS response. `Ok(None)`: not the answer to question `id` (ignore it);
/// `Ok(Some(result))`: the lookup's result; `Err`: a malformed message.
fn decode_answer(
    id: u16,
    qtype: u16,
    message: &[u8],
) -> io::Result<Option<io::Result<Vec<IpAddr>>>> {
    let malformed = || io::Error::new(io::ErrorKind::InvalidData, "malformed DNS answer");
    let mut reader = Reader { message, at: 0 };
    let answer_id = reader.u16().ok_or_else(malformed)?;
    let flags = reader.u16().ok_or_else(malformed)?;
    let is_response = flags & 0x8000 != 0;
    if answer_id != id || !is_response {
        return Ok(None);
    }
    let questions = reader.u16().ok_or_else(malformed)?;
    let answers = reader.u16().ok_or_else(malformed)?;
    reader.skip(4).ok_or_else(malformed)?; // authority and additional counts
    match flags & 0x000F {
        0 => {}
        RCODE_NXDOMAIN => {
            return Ok(Some(Err(io::Error::new(
                io::ErrorKind::NotFound,
                "NXDOMAIN",
            ))));
        }
        rcode => {
            return Ok(Some(Err(io::Error::other(format!(
                "the nameserver answered with rcode {rcode}"
            )))));
        }
    }
    if flags & 0x0200 != 0 && answers == 0 {
        return Ok(Some(Err(io::Error::other("the answer was truncated"))));
    }
    for _ in 0..questions {
        reader.skip_name().ok_or_else(malformed)?;
        reader.skip(4).ok_or_else(malformed)?;
    }
    let mut ips = Vec::new();
    for _ in 0..answers {
        reader.skip_name().ok_or_else(malformed)?;
        let record_type = reader.u16().ok_or_else(malformed)?;
        let class = reader.u16().ok_or_else(malformed)?;
        reader.skip(4).ok_or_else(malformed)?; // TTL
        let len = usize::from(reader.u16().ok_or_else(malformed)?);
        let data = reader.take(len).ok_or_else(malformed)?;
        // CNAMEs on the way are skipped: the chain's addresses follow in the answer.
        if class != CLASS_IN || record_type != qtype {
            continue;
        }
        if let Ok(octets) = <[u8; 4]>::try_from(data) {
            ips.push(IpAddr::from(octets));
        } else if let Ok(octets) = <[u8; 16]>::try_from(data) {
            ips.push(IpAddr::from(octets));
        }
    }
    if ips.is_empty() {
        return Ok(Some(Err(io::Error::new(
            io::ErrorKind::NotFound,
            "no address in the answer",
        ))));
    }
    Ok(Some(Ok(ips)))
}

/// A bounds-checked cursor over a DNS message.
struct Reader<'a> {
    message: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(len)?;
        let bytes = self.message.get(self.at..end)?;
        self.at = end;
        Some(bytes)
    }

    fn skip(&mut self, len: usize) -> Option<()> {
        self.take(len).map(|_| ())
    }

    fn u16(&mut self) -> Option<u16> {
        let bytes = self.take(2)?;
        Some(u16::from_be_bytes([*bytes.first()?, *bytes.get(1)?]))
    }

    /// Skips a name: labels up to the root, or up to a compression pointer (2 bytes,
    /// which ends the name here; its target is not followed, so no pointer loop).
    fn skip_name(&mut self) -> Option<()> {
        loop {
            let len = *self.take(1)?.first()?;
            match len {
                0 => return Some(()),
                len if len & 0xC0 == 0xC0 => return self.skip(1),
                len if len & 0xC0 == 0 => self.skip(usize::from(len))?,
                _ => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A response to `query` with the given rcode and A records for its name.
    fn respond(query: &[u8], rcode: u16, records: &[[u8; 4]]) -> Vec<u8> {
        let mut answer = Vec::new();
        answer.extend_from_slice(&query[..2]);
        answer.extend_from_slice(&(0x8180_u16 | rcode).to_be_bytes());
        answer.extend_from_slice(&[0, 1]);
        answer.extend_from_slice(&u16::try_from(records.len()).unwrap().to_be_bytes());
        answer.extend_from_slice(&[0, 0, 0, 0]);
        answer.extend_from_slice(&query[12..]); // the question
        for record in records {
            answer.extend_from_slice(&[0xC0, 12]); // the question's name
            answer.extend_from_slice(&TYPE_A.to_be_bytes());
            answer.extend_from_slice(&CLASS_IN.to_be_bytes());
            answer.extend_from_slice(&30_u32.to_be_bytes());
            answer.extend_from_slice(&4_u16.to_be_bytes());
            answer.extend_from_slice(record);
        }
        answer
    }

    #[test]
    fn the_query_asks_one_recursive_question_for_the_absolute_name() {
        let query =
            encode_query(0xBEEF, "c-hot-1.c-hot-nodes.ns.svc.cluster.local.", TYPE_A).unwrap();
        assert_eq!(&query[..12], &[0xBE, 0xEF, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&query[12..20], b"\x07c-hot-1");
        assert!(query.ends_with(b"\x05local\x00\x00\x01\x00\x01"));
        assert!(encode_query(1, "a..b", TYPE_A).is_err());
        assert!(encode_query(1, &"x".repeat(64), TYPE_A).is_err());
    }

    #[test]
    fn addresses_nxdomain_and_foreign_ids_are_told_apart() {
        let query = encode_query(7, "node-0.pool.ns.svc.cluster.local", TYPE_A).unwrap();
        let found = respond(&query, 0, &[[10, 244, 0, 9], [10, 244, 0, 12]]);
        let ips = decode_answer(7, TYPE_A, &found).unwrap().unwrap().unwrap();
        assert_eq!(
            ips,
            vec![
                IpAddr::from([10, 244, 0, 9]),
                IpAddr::from([10, 244, 0, 12])
            ]
        );

        let nx = respond(&query, RCODE_NXDOMAIN, &[]);
        let err = decode_answer(7, TYPE_A, &nx).unwrap().unwrap().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);

        let empty = respond(&query, 0, &[]);
        let err = decode_answer(7, TYPE_A, &empty)
            .unwrap()
            .unwrap()
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);

        assert!(
            decode_answer(8, TYPE_A, &found).unwrap().is_none(),
            "another question's ID"
        );
        let mut the_query_itself = query.clone();
        the_query_itself[2] &= 0x7F;
        assert!(
            decode_answer(7, TYPE_A, &the_query_itself)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn every_truncation_of_an_answer_is_an_error_never_a_panic() {
        let query = encode_query(7, "node-0.pool.ns.svc.cluster.local", TYPE_A).unwrap();
        let found = respond(&query, 0, &[[10, 244, 0, 9]]);
        for len in 0..found.len() {
            let result = decode_answer(7, TYPE_A, &found[..len]);
            assert!(
                result.is_err() || result.is_ok_and(|answer| answer.is_none()),
                "at {len}"
            );
        }
        // A label length with the reserved top bits set.
        let mut bad = found.clone();
        bad[12] = 0x80;
        assert!(decode_answer(7, TYPE_A, &bad).is_err());
    }

    #[test]
    fn nameservers_come_from_resolv_conf_in_order_at_most_three() {
        let text = "search ns.svc.cluster.local svc.cluster.local\n\
                    nameserver 10.96.0.10\n# nameserver 1.1.1.1\nnameserver fd00::a\n\
                    options ndots:5\nnameserver 10.0.0.2\nnameserver 10.0.0.3\n";
        let servers: Vec<String> = nameservers(text).iter().map(ToString::to_string).collect();
        assert_eq!(servers, ["10.96.0.10:53", "[fd00::a]:53", "10.0.0.2:53"]);
        assert!(nameservers("search x\n").is_empty());
    }

    #[tokio::test]
    async fn a_lookup_is_answered_by_the_nameserver_over_udp() {
        let server = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let address = server.local_addr().unwrap();
        let serve = tokio::spawn(async move {
            let mut buffer = [0_u8; 512];
            let (len, from) = server.recv_from(&mut buffer).await.unwrap();
            let query = &buffer[..len];
            // A stray datagram with another ID first: the lookup must wait for its own.
            let mut stray = respond(query, 0, &[[192, 0, 2, 1]]);
            stray[0] ^= 0xFF;
            server.send_to(&stray, from).await.unwrap();
            server
                .send_to(&respond(query, 0, &[[10, 244, 0, 9]]), from)
                .await
                .unwrap();
        });
        let ips = lookup("node-0.pool.ns.svc.cluster.local", Family::V4, &[address])
            .await
            .unwrap();
        assert_eq!(ips, vec![IpAddr::from([10, 244, 0, 9])]);
        serve.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_nameserver_costs_one_timeout_then_the_next_is_asked() {
        let silent = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let answering = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let servers = [
            silent.local_addr().unwrap(),
            answering.local_addr().unwrap(),
        ];
        let serve = tokio::spawn(async move {
            let mut buffer = [0_u8; 512];
            let (len, from) = answering.recv_from(&mut buffer).await.unwrap();
            let nx = respond(&buffer[..len], RCODE_NXDOMAIN, &[]);
            answering.send_to(&nx, from).await.unwrap();
        });
        let err = lookup("gone.pool.ns.svc.cluster.local", Family::V4, &servers)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
        serve.await.unwrap();
        drop(silent);
    }
}
