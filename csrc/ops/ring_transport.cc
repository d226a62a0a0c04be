// EPL ring transport: sockets, connection setup and the full-duplex exchange loop.
#include "ring_transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "ring_errno.h"

namespace epl {
namespace ring {
namespace {

const uint64_t kMagic = 0x45504c52494e4731ULL;  // "EPLRING1"
const int kSocketBuffer = 4 << 20;
const size_t kShmCapacity = 2 << 20;  // per upgraded link
// Waiting on shared-memory links: re-check, yielding the core to any runnable
// thread in between, for this long; then sleep in short naps, so a member
// waiting for a slow peer leaves its core to the training threads.
const double kSpinSeconds = 1e-3;
const long kNapNanoseconds = 50000;

double Now() {
  using Clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

void Tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &kSocketBuffer, sizeof(kSocketBuffer));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &kSocketBuffer, sizeof(kSocketBuffer));
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
}

void CloseFd(int* fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

// Blocking-with-deadline transfer of a small buffer (handshakes).
Result SendAll(int fd, const char* data, size_t bytes, double deadline) {
  size_t done = 0;
  while (done < bytes) {
    ssize_t n = send(fd, data + done, bytes - done, MSG_NOSIGNAL);
    if (n > 0) { done += n; continue; }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      return Result::Fail(Errno("send"));
    pollfd p{fd, POLLOUT, 0};
    int wait_ms = static_cast<int>((deadline - Now()) * 1000);
    if (wait_ms <= 0 || poll(&p, 1, wait_ms) == 0) return Result::Fail("send timed out");
  }
  return Result::Ok();
}

Result RecvAll(int fd, char* data, size_t bytes, double deadline) {
  size_t done = 0;
  while (done < bytes) {
    ssize_t n = recv(fd, data + done, bytes - done, 0);
    if (n > 0) { done += n; continue; }
    if (n == 0) return Result::Fail("peer closed the connection");
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      return Result::Fail(Errno("recv"));
    pollfd p{fd, POLLIN, 0};
    int wait_ms = static_cast<int>((deadline - Now()) * 1000);
    if (wait_ms <= 0 || poll(&p, 1, wait_ms) == 0) return Result::Fail("recv timed out");
  }
  return Result::Ok();
}

struct Hello {
  uint64_t magic;
  uint64_t communicator_hash;
  uint64_t rank;
};

uint64_t Hash(const std::string& text) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ULL;
  return h;
}

// Sent to the successor after the TCP handshake; nonce 0 means "stay on TCP".
struct ShmOffer {
  uint64_t magic;
  uint64_t nonce;
  char name[64];
};

uint64_t RandomNonce() {
  std::random_device device;
  return ((static_cast<uint64_t>(device()) << 32) ^ device()) | 1;
}

// The offer to the successor: a new segment's name and nonce, or nonce 0 ("stay
// on TCP") when shared memory is off or the segment cannot be created (`why`).
ShmOffer MakeOffer(bool shared_memory, std::unique_ptr<ShmQueue>* mine, std::string* name,
                   std::string* why) {
  ShmOffer offer{};
  offer.magic = kMagic;
  if (!shared_memory) return offer;
  offer.nonce = RandomNonce();
  *mine = ShmQueue::Create(offer.nonce, kShmCapacity, name, why);
  if (*mine) std::strncpy(offer.name, name->c_str(), sizeof(offer.name) - 1);
  else offer.nonce = 0;
  return offer;
}

}  // namespace

Member::Member(const std::string& communicator, int rank, int size)
    : communicator_(communicator), rank_(rank), size_(size) {}

Member::~Member() {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  CloseRing();
  CloseFd(&listen_fd_);
}

void Member::Submit(std::function<void()> work) {
  std::lock_guard<std::mutex> lock(queue_mu_);
  if (!worker_.joinable()) {
    worker_ = std::thread([this]() {
      for (;;) {
        std::function<void()> work;
        {
          std::unique_lock<std::mutex> wait(queue_mu_);
          queue_cv_.wait(wait, [this]() { return stopping_ || !queue_.empty(); });
          if (queue_.empty()) return;
          work = std::move(queue_.front());
          queue_.pop_front();
        }
        work();
      }
    });
  }
  queue_.push_back(std::move(work));
  queue_cv_.notify_one();
}

std::string Member::PeerName(int peer) const {
  std::ostringstream out;
  out << "rank " << peer;
  if (peer >= 0 && peer < static_cast<int>(hosts_.size()) &&
      peer < static_cast<int>(ports_.size()))
    out << " (" << hosts_[peer] << ":" << ports_[peer] << ")";
  return out.str();
}

void Member::CloseRing() {
  next_shm_.reset();
  prev_shm_.reset();
  CloseFd(&next_fd_);
  CloseFd(&prev_fd_);
}

char* Member::Scratch(int slot, size_t bytes) {
  std::vector<char>& buffer = scratch_[slot];
  if (buffer.size() < bytes) buffer.resize(bytes);
  return buffer.data();
}

int Member::LinkState() const {
  // A one-member ring has no links and is always ready.
  return (connected() || size_ == 1 ? 1 : 0) | (next_shm_ ? 2 : 0) | (prev_shm_ ? 4 : 0);
}

// Offers the successor a shared-memory segment and answers the predecessor's
// offer. A link is upgraded only when its consumer mapped the segment and said
// so, so both ends always agree on how each link carries bytes. A link that
// stays on TCP although its producer offered a segment is recorded with the
// reason by the end that failed.
Result Member::UpgradeLinks(bool shared_memory, double deadline) {
  std::string name, why;
  std::unique_ptr<ShmQueue> mine;
  ShmOffer offer = MakeOffer(shared_memory, &mine, &name, &why);
  if (shared_memory && !mine) NoteFallback(rank_, next(), why);
  ShmOffer theirs{};
  uint64_t accepted = 0, answer = 0;
  Result r = SendAll(next_fd_, reinterpret_cast<const char*>(&offer), sizeof(offer), deadline);
  if (r.ok()) r = RecvAll(prev_fd_, reinterpret_cast<char*>(&theirs), sizeof(theirs), deadline);
  if (r.ok() && theirs.magic != kMagic) r = Result::Fail("bad link offer from predecessor");
  if (r.ok() && theirs.nonce != 0) {
    theirs.name[sizeof(theirs.name) - 1] = 0;
    std::string refused = "shared memory is turned off on " + PeerName(rank_);
    if (shared_memory) prev_shm_ = ShmQueue::Open(theirs.name, theirs.nonce, &refused);
    if (!prev_shm_) NoteFallback(prev(), rank_, refused);
    accepted = prev_shm_ ? 1 : 0;
  }
  if (r.ok()) r = SendAll(prev_fd_, reinterpret_cast<const char*>(&accepted), 8, deadline);
  if (r.ok()) r = RecvAll(next_fd_, reinterpret_cast<char*>(&answer), 8, deadline);
  ShmQueue::Unlink(name);
  if (r.ok() && answer == 1) next_shm_ = std::move(mine);
  return r;
}

// Records why the link from -> to stays on TCP, once per link and process.
void Member::NoteFallback(int from, int to, const std::string& reason) {
  bool& noted = from == rank_ ? next_fallback_noted_ : prev_fallback_noted_;
  if (noted) return;
  noted = true;
  const int hosts = static_cast<int>(hosts_.size());
  bool same_host = from < hosts && to < hosts && hosts_[from] == hosts_[to];
  fallbacks_.push_back({PeerName(from) + " -> " + PeerName(to), reason, same_host});
}

std::vector<LinkFallback> Member::TakeFallbacks() {
  std::lock_guard<std::mutex> lock(setup_mu_);
  std::vector<LinkFallback> taken;
  taken.swap(fallbacks_);
  return taken;
}

Result Member::Listen(int* port) {
  std::lock_guard<std::mutex> lock(setup_mu_);
  if (listen_fd_ < 0) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return Result::Fail(Errno("socket"));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        listen(fd, 16) != 0 || getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      Result r = Result::Fail(Errno("bind/listen"));
      close(fd);
      return r;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
    listen_fd_ = fd;
    listen_port_ = ntohs(addr.sin_port);
  }
  *port = listen_port_;
  return Result::Ok();
}

Result Member::ConnectNext(const std::string& host, int port, double timeout) {
  double deadline = Now() + timeout;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* info = nullptr;
  std::string service = std::to_string(port);
  if (getaddrinfo(host.c_str(), service.c_str(), &hints, &info) != 0 || info == nullptr)
    return Result::Fail("cannot resolve " + host);
  Result result = Result::Fail("connect timed out");
  while (Now() < deadline) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0 && connect(fd, info->ai_addr, info->ai_addrlen) == 0) {
      Tune(fd);
      Hello hello{kMagic, Hash(communicator_), static_cast<uint64_t>(rank_)};
      result = SendAll(fd, reinterpret_cast<const char*>(&hello), sizeof(hello), deadline);
      if (result.ok()) {
        next_fd_ = fd;
        break;
      }
    }
    if (fd >= 0) close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  freeaddrinfo(info);
  return result;
}

Result Member::AcceptPrev(double timeout) {
  double deadline = Now() + timeout;
  while (Now() < deadline) {
    pollfd p{listen_fd_, POLLIN, 0};
    int wait_ms = static_cast<int>((deadline - Now()) * 1000);
    if (wait_ms <= 0 || poll(&p, 1, wait_ms) <= 0) break;
    int fd = accept(listen_fd_, nullptr, nullptr);
    if (fd < 0) continue;
    Tune(fd);
    Hello hello{};
    Result r = RecvAll(fd, reinterpret_cast<char*>(&hello), sizeof(hello), deadline);
    if (r.ok() && hello.magic == kMagic && hello.communicator_hash == Hash(communicator_) &&
        hello.rank == static_cast<uint64_t>(prev())) {
      prev_fd_ = fd;
      return Result::Ok();
    }
    close(fd);  // a stale or foreign connection: keep waiting for the right peer
  }
  return Result::Fail("no connection from " + PeerName(prev()) + " within the timeout");
}

Result Member::Connect(const std::vector<int>& ports, const std::vector<std::string>& hosts,
                       double timeout, bool shared_memory) {
  std::lock_guard<std::mutex> lock(setup_mu_);
  if (size_ == 1) return Result::Ok();
  if (connected() && ports == ports_ && hosts == hosts_) return Result::Ok();
  if (listen_fd_ < 0) return Result::Fail("Listen must run before Connect");
  CloseRing();
  ports_ = ports;
  hosts_ = hosts;
  // Connect in a helper thread while this one accepts: with two members each is
  // the other's successor and predecessor, and neither call may wait for the other.
  Result connect_result;
  std::thread connector(
      [&]() { connect_result = ConnectNext(hosts[next()], ports[next()], timeout); });
  Result accept_result = AcceptPrev(timeout);
  connector.join();
  if (!connect_result.ok()) {
    CloseRing();
    return Result::Fail("connecting to " + PeerName(next()) + ": " + connect_result.error);
  }
  if (!accept_result.ok()) {
    CloseRing();
    return accept_result;
  }
  Result upgrade = UpgradeLinks(shared_memory, Now() + timeout);
  if (!upgrade.ok()) {
    CloseRing();
    return Result::Fail("setting up the links with " + PeerName(next()) + ": " + upgrade.error);
  }
  return Result::Ok();
}

Result Member::Exchange(uint64_t instance, uint64_t step, const char* send_data,
                        size_t send_bytes, char* recv_data, size_t recv_bytes,
                        double timeout) {
  if (!connected())
    return Result::Fail("ring not connected (its setup did not run, or an earlier collective "
                        "on it failed)");
  Result result = ExchangeOnce(instance, step, send_data, send_bytes, recv_data, recv_bytes,
                               timeout);
  // After a failure the byte streams are out of step with the peers': drop the
  // connections so later collectives fail fast until the ring is set up again.
  if (!result.ok()) CloseRing();
  return result;
}

long Member::SendSome(const char* data, size_t bytes, std::string* error) {
  if (next_shm_) return static_cast<long>(next_shm_->Push(data, bytes));
  ssize_t n = send(next_fd_, data, bytes, MSG_NOSIGNAL);
  if (n >= 0) return n;
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
  *error = Errno("send to " + PeerName(next()));
  return -1;
}

long Member::RecvSome(char* data, size_t bytes, std::string* error) {
  if (prev_shm_) return static_cast<long>(prev_shm_->Pop(data, bytes));
  if (bytes == 0) return 0;
  ssize_t n = recv(prev_fd_, data, bytes, 0);
  if (n > 0) return n;
  if (n == 0) {
    *error = PeerName(prev()) + " closed the connection";
    return -1;
  }
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
  *error = Errno("recv from " + PeerName(prev()));
  return -1;
}

// Blocks until a link may move bytes. TCP links wait in poll(). Shared-memory
// links cannot wake poll(), so they are re-checked after short naps; their TCP
// sockets are watched meanwhile: the peer never writes to them after the
// handshake, so a readable socket means the peer's process has gone.
Result Member::WaitForLinks(bool want_send, bool want_recv, double idle_seconds) {
  short next_events = next_shm_ ? POLLIN : (want_send ? POLLOUT : 0);
  short prev_events = prev_shm_ ? POLLIN : (want_recv ? POLLIN : 0);
  pollfd fds[2] = {{next_fd_, next_events, 0}, {prev_fd_, prev_events, 0}};
  int ready;
  if (!next_shm_ && !prev_shm_) {
    ready = poll(fds, 2, 200);
  } else {
    bool spin = idle_seconds < kSpinSeconds;
    timespec nap{0, spin ? 0 : kNapNanoseconds};
    ready = ppoll(fds, 2, &nap, nullptr);
    if (spin) sched_yield();
  }
  if (ready < 0 && errno != EINTR) return Result::Fail(Errno("poll"));
  const short gone = POLLIN | POLLHUP | POLLERR;
  if (next_shm_ && (fds[0].revents & gone))
    return Result::Fail(PeerName(next()) + " closed the connection");
  if (prev_shm_ && (fds[1].revents & gone))
    return Result::Fail(PeerName(prev()) + " closed the connection");
  return Result::Ok();
}

Result Member::ExchangeOnce(uint64_t instance, uint64_t step, const char* send_data,
                            size_t send_bytes, char* recv_data, size_t recv_bytes,
                            double timeout) {
  Header out{kMagic, instance, step, send_bytes};
  Header in{};
  const char* out_parts[2] = {reinterpret_cast<const char*>(&out), send_data};
  size_t out_sizes[2] = {sizeof(out), send_bytes};
  char* in_parts[2] = {reinterpret_cast<char*>(&in), recv_data};
  size_t in_sizes[2] = {sizeof(in), recv_bytes};
  int out_part = 0, in_part = 0;
  size_t out_done = 0, in_done = 0;
  double last_progress = Now();
  std::string error;
  while (out_part < 2 || in_part < 2) {
    bool progress = false;
    if (out_part < 2) {
      long n = SendSome(out_parts[out_part] + out_done, out_sizes[out_part] - out_done, &error);
      if (n < 0) return Result::Fail(error);
      out_done += n;
      progress = n > 0;
      while (out_part < 2 && out_done == out_sizes[out_part]) {
        ++out_part;
        out_done = 0;
        progress = true;
      }
    }
    if (in_part < 2) {
      long n = RecvSome(in_parts[in_part] + in_done, in_sizes[in_part] - in_done, &error);
      if (n < 0) return Result::Fail(error);
      in_done += n;
      progress = progress || n > 0;
      while (in_part < 2 && in_done == in_sizes[in_part]) {
        if (in_part == 0 && (in.magic != kMagic || in.instance != instance || in.step != step ||
                             in.bytes != recv_bytes)) {
          std::ostringstream msg;
          msg << PeerName(prev()) << " is running a different collective "
              << "(instance " << in.instance << " step " << in.step << ", " << in.bytes
              << " bytes) than this member (instance " << instance << " step " << step << ", "
              << recv_bytes << " bytes)";
          return Result::Fail(msg.str());
        }
        ++in_part;
        in_done = 0;
        progress = true;
      }
    }
    double now = Now();
    if (progress) {
      last_progress = now;
      continue;
    }
    if (now - last_progress > timeout) {
      std::ostringstream msg;
      msg << "no progress for " << timeout << " s exchanging with "
          << PeerName(next()) << " / " << PeerName(prev());
      return Result::Fail(msg.str());
    }
    Result waited = WaitForLinks(out_part < 2, in_part < 2, now - last_progress);
    if (!waited.ok()) return waited;
  }
  return Result::Ok();
}

std::shared_ptr<Member> GetMember(const std::string& communicator, int rank, int size) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<Member>>* members =
      new std::map<std::string, std::shared_ptr<Member>>();
  std::lock_guard<std::mutex> lock(mu);
  std::string key = communicator + "#" + std::to_string(rank) + "/" + std::to_string(size);
  auto it = members->find(key);
  if (it != members->end()) return it->second;
  auto member = std::make_shared<Member>(communicator, rank, size);
  (*members)[key] = member;
  return member;
}

}  // namespace ring
}  // namespace epl
