// S3 XML bodies, read with a few string searches (no XML library): the <Error> document every
// failed S3 request returns, and ListObjectsV2 result pages. Only the elements shardcache needs
// are read; entity references (&quot; &amp; &lt; &gt; &apos; &#N; &#xN;) are decoded.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shardcache::objstore {

// The text of the first <tag>...</tag> at or after *pos (entity-decoded), "" when absent.
// Advances *pos past the closing tag when found (pos may be null).
std::string XmlElement(const std::string& xml, const std::string& tag, size_t* pos = nullptr);
std::string XmlUnescape(const std::string& text);
// `text` with & < > " ' as entity references, for an element's content.
std::string XmlEscape(const std::string& text);

struct S3Error {
  std::string code;     // "NoSuchBucket", "SlowDown", ...; "" when the body is not an S3 error
  std::string message;  // S3's human-readable text
};
S3Error ParseS3Error(const std::string& body);

struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
  std::string etag;  // as the store quotes it, e.g. "\"6f59...\""
};

struct ListPage {
  std::vector<ObjectInfo> objects;
  bool truncated = false;
  std::string next_token;  // NextContinuationToken when truncated
};
// False when `xml` is not a ListBucketResult (or a truncated page carries no token).
bool ParseListPage(const std::string& xml, ListPage* page);

}  // namespace shardcache::objstore
