#include "agent/health/http_test_client.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>

namespace ddprun::agent::health_testing {
namespace {

constexpr int kReceiveTimeoutSeconds = 10;

sys::UniqueFd connect_loopback(int port) {
  sys::UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return fd;
  timeval tv{kReceiveTimeoutSeconds, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) fd.reset();
  return fd;
}

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return text;
}

// Parses "HTTP/1.1 200 OK\r\nName: value\r\n..." (without the blank line).
std::optional<ParsedResponse> parse_head(std::string_view head) {
  ParsedResponse res;
  size_t eol = head.find("\r\n");
  std::string_view status_line = head.substr(0, eol);
  if (!status_line.starts_with("HTTP/1.") || status_line.size() < 12) return std::nullopt;
  auto [ptr, ec] = std::from_chars(status_line.data() + 9, status_line.data() + 12, res.status);
  if (ec != std::errc()) return std::nullopt;
  while (eol != std::string_view::npos) {
    size_t start = eol + 2;
    eol = head.find("\r\n", start);
    std::string_view line = head.substr(start, eol == std::string_view::npos ? eol : eol - start);
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    res.headers[lower(std::string(line.substr(0, colon)))] = std::string(value);
  }
  return res;
}

}  // namespace

std::string ParsedResponse::header(const std::string& lower_name) const {
  auto it = headers.find(lower_name);
  return it == headers.end() ? std::string() : it->second;
}

std::string request(std::string_view method, std::string_view target, std::string_view extra) {
  std::string text(method);
  text += ' ';
  text += target;
  text += " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  text += extra;
  text += "\r\n";
  return text;
}

TestClient::TestClient(int port) : fd_(connect_loopback(port)) {
  EXPECT_TRUE(fd_) << "cannot connect to 127.0.0.1:" << port << ": " << std::strerror(errno);
}

bool TestClient::can_connect(int port) {
  return static_cast<bool>(connect_loopback(port));
}

bool TestClient::send(std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::send(fd_.get(), data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

bool TestClient::fill() {
  char buf[4096];
  for (;;) {
    ssize_t n = ::recv(fd_.get(), buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    pending_.append(buf, static_cast<size_t>(n));
    return true;
  }
}

std::optional<ParsedResponse> TestClient::read_response(bool head) {
  size_t end;
  while ((end = pending_.find("\r\n\r\n")) == std::string::npos) {
    if (!fill()) return std::nullopt;
  }
  auto res = parse_head(std::string_view(pending_).substr(0, end));
  if (!res) return std::nullopt;
  pending_.erase(0, end + 4);
  if (head) return res;
  size_t length = 0;
  std::string text = res->header("content-length");
  std::from_chars(text.data(), text.data() + text.size(), length);
  while (pending_.size() < length) {
    if (!fill()) return std::nullopt;
  }
  res->body = pending_.substr(0, length);
  pending_.erase(0, length);
  return res;
}

bool TestClient::wait_closed(std::string* received) {
  for (;;) {
    char buf[4096];
    ssize_t n = ::recv(fd_.get(), buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n > 0) {
      pending_.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (received != nullptr) *received += pending_;
    pending_.clear();
    return n == 0 || errno == ECONNRESET;
  }
}

}  // namespace ddprun::agent::health_testing
