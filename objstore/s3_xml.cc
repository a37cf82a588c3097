#include "objstore/s3_xml.h"

#include <cstdlib>

namespace shardcache::objstore {
namespace {

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Decodes the entity `name` (between '&' and ';'); false when unknown.
bool DecodeEntity(const std::string& name, std::string* out) {
  static const struct { const char* name; char c; } kNamed[] = {
      {"quot", '"'}, {"amp", '&'}, {"lt", '<'}, {"gt", '>'}, {"apos", '\''}};
  for (const auto& e : kNamed) {
    if (name == e.name) {
      out->push_back(e.c);
      return true;
    }
  }
  if (name.size() < 2 || name[0] != '#') return false;
  const bool hex = name[1] == 'x' || name[1] == 'X';
  const std::string digits = name.substr(hex ? 2 : 1);
  if (digits.empty()) return false;
  char* end = nullptr;
  const unsigned long cp = std::strtoul(digits.c_str(), &end, hex ? 16 : 10);
  if (*end != '\0' || cp > 0x10FFFF) return false;
  AppendUtf8(static_cast<uint32_t>(cp), out);
  return true;
}

}  // namespace

std::string XmlUnescape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const size_t semi = text[i] == '&' ? text.find(';', i) : std::string::npos;
    if (semi != std::string::npos && semi - i <= 10 && DecodeEntity(text.substr(i + 1, semi - i - 1), &out)) {
      i = semi;
      continue;
    }
    out.push_back(text[i]);
  }
  return out;
}

std::string XmlElement(const std::string& xml, const std::string& tag, size_t* pos) {
  const std::string open = "<" + tag + ">", close = "</" + tag + ">";
  const size_t from = pos ? *pos : 0;
  const size_t b = xml.find(open, from);
  if (b == std::string::npos) return "";
  const size_t e = xml.find(close, b + open.size());
  if (e == std::string::npos) return "";
  if (pos) *pos = e + close.size();
  return XmlUnescape(xml.substr(b + open.size(), e - b - open.size()));
}

S3Error ParseS3Error(const std::string& body) {
  S3Error e;
  const size_t root = body.find("<Error>");
  if (root == std::string::npos) return e;
  size_t pos = root;
  e.code = XmlElement(body, "Code", &pos);
  pos = root;
  e.message = XmlElement(body, "Message", &pos);
  return e;
}

bool ParseListPage(const std::string& xml, ListPage* page) {
  if (xml.find("<ListBucketResult") == std::string::npos) return false;
  page->objects.clear();
  size_t pos = 0;
  while (true) {
    const size_t b = xml.find("<Contents>", pos);
    if (b == std::string::npos) break;
    const size_t e = xml.find("</Contents>", b);
    if (e == std::string::npos) return false;
    const std::string entry = xml.substr(b, e - b);
    ObjectInfo o;
    o.key = XmlElement(entry, "Key");
    o.size = std::strtoull(XmlElement(entry, "Size").c_str(), nullptr, 10);
    o.etag = XmlElement(entry, "ETag");
    page->objects.push_back(std::move(o));
    pos = e;
  }
  // The elements after the last <Contents> (or all of them) hold the page's own fields; S3
  // puts IsTruncated before the contents, s3rver too, so search from the start for each.
  page->truncated = XmlElement(xml, "IsTruncated") == "true";
  page->next_token = XmlElement(xml, "NextContinuationToken");
  return !(page->truncated && page->next_token.empty());
}

std::string XmlEscape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace shardcache::objstore
