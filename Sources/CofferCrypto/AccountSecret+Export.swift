/// Export formats for an account secret.
///
/// The phrase is BIP-39 shaped: 256 bits of seed plus an 8-bit checksum (first byte of its
/// SHA-256) cut into 24 words of 11 bits. A wrong or mistyped word is caught by the word list or
/// the checksum. The base64 form is `coffer1:` + base64(version byte, seed, 4 checksum bytes).
extension AccountSecret {
    public static let phraseWordCount = 24
    static let base64Prefix = "coffer1:"

    public var phrase: [String] {
        let checksum = sha256(seed)[0]
        let bits = seed + [checksum]  // 264 bits
        var words: [String] = []
        for i in 0..<Self.phraseWordCount {
            var index = 0
            for b in 0..<11 {
                let bit = i * 11 + b
                let on = (bits[bit / 8] >> (7 - UInt8(bit % 8))) & 1
                index = (index << 1) | Int(on)
            }
            words.append(String(bip39EnglishWords[index]))
        }
        return words
    }

    public init(phrase text: String) throws {
        let words = text.lowercased().split(whereSeparator: { $0 == " " || $0 == "\n" || $0 == "\t" || $0 == "," })
        guard words.count == Self.phraseWordCount else {
            throw CryptoError.invalidPhrase("expected \(Self.phraseWordCount) words, got \(words.count)")
        }
        var bits = [UInt8](repeating: 0, count: 33)
        for (i, word) in words.enumerated() {
            guard let index = Self.wordIndex(word) else {
                throw CryptoError.invalidPhrase("word \(i + 1) (\"\(word)\") is not in the word list")
            }
            for b in 0..<11 where (index >> (10 - b)) & 1 == 1 {
                let bit = i * 11 + b
                bits[bit / 8] |= 1 << (7 - UInt8(bit % 8))
            }
        }
        let seed = Array(bits[0..<32])
        guard sha256(seed)[0] == bits[32] else {
            throw CryptoError.invalidPhrase("checksum does not match; a word is wrong or out of order")
        }
        self.init(unchecked: seed)
    }

    private static func wordIndex(_ word: Substring) -> Int? {
        var lo = 0
        var hi = bip39EnglishWords.count - 1
        while lo <= hi {
            let mid = (lo + hi) / 2
            let w = bip39EnglishWords[mid]
            if w == word { return mid }
            if w < word { lo = mid + 1 } else { hi = mid - 1 }
        }
        return nil
    }

    public var base64: String {
        let body: [UInt8] = [1] + seed
        return Self.base64Prefix + Base64.encode(body + Array(sha256(body).prefix(4)))
    }

    public init(base64 text: String) throws {
        let trimmed = text.trimmingWhitespace()
        guard trimmed.hasPrefix(Self.base64Prefix) else {
            throw CryptoError.invalidEncoding("expected a string starting with \(Self.base64Prefix)")
        }
        guard let raw = Base64.decode(String(trimmed.dropFirst(Self.base64Prefix.count))), raw.count == 37 else {
            throw CryptoError.invalidEncoding("not valid base64 of the right length")
        }
        guard raw[0] == 1 else { throw CryptoError.invalidEncoding("unknown version \(raw[0])") }
        let body = Array(raw[0..<33])
        guard Array(sha256(body).prefix(4)) == Array(raw[33...]) else {
            throw CryptoError.invalidEncoding("checksum does not match; the string is damaged")
        }
        self.init(unchecked: Array(raw[1..<33]))
    }

    /// Accepts either export form.
    public init(exported text: String) throws {
        let trimmed = text.trimmingWhitespace()
        if trimmed.hasPrefix(Self.base64Prefix) {
            try self.init(base64: trimmed)
        } else {
            try self.init(phrase: trimmed)
        }
    }
}

extension String {
    func trimmingWhitespace() -> String {
        var s = Substring(self)
        while let f = s.first, f.isWhitespace { s.removeFirst() }
        while let l = s.last, l.isWhitespace { s.removeLast() }
        return String(s)
    }
}

/// Standard base64 (RFC 4648) without Foundation, so the crypto module stays dependency-free.
public enum Base64 {
    static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)

    public static func encode(_ data: [UInt8]) -> String {
        var out: [UInt8] = []
        out.reserveCapacity((data.count + 2) / 3 * 4)
        var i = 0
        while i + 3 <= data.count {
            let n = (UInt32(data[i]) << 16) | (UInt32(data[i + 1]) << 8) | UInt32(data[i + 2])
            out += [
                alphabet[Int(n >> 18) & 63], alphabet[Int(n >> 12) & 63], alphabet[Int(n >> 6) & 63],
                alphabet[Int(n) & 63],
            ]
            i += 3
        }
        let rest = data.count - i
        if rest == 1 {
            let n = UInt32(data[i]) << 16
            out += [alphabet[Int(n >> 18) & 63], alphabet[Int(n >> 12) & 63], 61, 61]
        } else if rest == 2 {
            let n = (UInt32(data[i]) << 16) | (UInt32(data[i + 1]) << 8)
            out += [alphabet[Int(n >> 18) & 63], alphabet[Int(n >> 12) & 63], alphabet[Int(n >> 6) & 63], 61]
        }
        return String(decoding: out, as: UTF8.self)
    }

    public static func decode(_ text: String) -> [UInt8]? {
        var values: [UInt8] = []
        var padding = 0
        for c in text.utf8 {
            switch c {
            case 65...90: values.append(c - 65)
            case 97...122: values.append(c - 71)
            case 48...57: values.append(c + 4)
            case 43: values.append(62)
            case 47: values.append(63)
            case 61:
                padding += 1
                continue
            default: return nil
            }
            if padding > 0 { return nil }
        }
        guard (values.count + padding) % 4 == 0, padding <= 2 else { return nil }
        var out: [UInt8] = []
        var i = 0
        while i < values.count {
            let chunk = values[i..<min(i + 4, values.count)]
            var n: UInt32 = 0
            for (j, v) in chunk.enumerated() { n |= UInt32(v) << (18 - 6 * UInt32(j)) }
            out.append(UInt8((n >> 16) & 0xff))
            if chunk.count > 2 { out.append(UInt8((n >> 8) & 0xff)) }
            if chunk.count > 3 { out.append(UInt8(n & 0xff)) }
            i += 4
        }
        return out
    }
}
