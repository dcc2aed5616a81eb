import CSodium

/// What a ciphertext is for. It goes into the associated data, so a sealed name can never be
/// accepted as sealed content, a key wrap, or the attributes of another file.
public enum SealPurpose: UInt8, Sendable {
    case name = 1
    case keyWrap = 2
    case attributes = 3
    case chunk = 4
    case manifest = 5
    case accountKey = 6
    /// A shared file's name under its own key, for its grantees (`FileMetadata.shareName`).
    case shareName = 7
    /// Work saved from a share this account can no longer write to, queued until it is in the
    /// account's own tree (`recovery_queue`), under the account's root key.
    case recovery = 8
    /// The account's contact book as its devices share it through the server, under the
    /// account's root key (docs/SHARING.md, "Contacts across devices").
    case contacts = 9

    /// Names and attributes (which hold symlink targets and xattr values) are padded before
    /// sealing (`Padding`), so the server does not learn their exact lengths.
    var isPadded: Bool { self == .name || self == .attributes || self == .shareName }
}

/// Length hiding for short values: the plaintext gets a 0x80 byte and zeros up to a bucket
/// (ISO/IEC 7816-4 padding, removable without knowing the length). Names go to a multiple of 32
/// bytes (gocryptfs uses 16; Coffer's 255-byte names take at most 8 sizes), attributes to a
/// multiple of max(64, a sixteenth of the next power of two), so they leak about four bits of
/// their length and cost at most 1/8 more.
public enum Padding {
    /// Sealed values stay below this (the record decoder's limit for attributes) unless the
    /// value alone is already larger.
    static let ceiling = (1 << 20) - AEAD.overhead

    public static func paddedLength(_ length: Int, purpose: SealPurpose) -> Int {
        let n = length + 1
        var bucket = 32
        if purpose == .attributes {
            bucket = 64
            while bucket * 16 < n { bucket *= 2 }
        }
        let padded = (n + bucket - 1) / bucket * bucket
        return padded > ceiling ? max(n, ceiling) : padded
    }

    static func pad(_ plaintext: UnsafeRawBufferPointer, purpose: SealPurpose) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: paddedLength(plaintext.count, purpose: purpose))
        out.withUnsafeMutableBytes { o in
            if let base = plaintext.baseAddress, plaintext.count > 0 {
                o.baseAddress?.copyMemory(from: base, byteCount: plaintext.count)
            }
        }
        out[plaintext.count] = 0x80
        return out
    }

    /// The value without its padding; nil when the padding is malformed.
    static func unpad(_ padded: [UInt8]) -> [UInt8]? {
        guard let end = padded.lastIndex(where: { $0 != 0 }), padded[end] == 0x80 else { return nil }
        return Array(padded[..<end])
    }
}

/// A 32-byte XChaCha20-Poly1305 key: every file has its own.
public struct SymmetricKey: Sendable, Hashable {
    public static let byteCount = 32
    public let bytes: [UInt8]

    public init(bytes: [UInt8]) throws {
        guard bytes.count == Self.byteCount else {
            throw CryptoError.invalidLength("a symmetric key has \(Self.byteCount) bytes, got \(bytes.count)")
        }
        self.bytes = bytes
    }

    /// A fresh random key.
    public static func random() -> SymmetricKey {
        ensureSodium()
        var k = [UInt8](repeating: 0, count: byteCount)
        crypto_aead_xchacha20poly1305_ietf_keygen(&k)
        return SymmetricKey(unchecked: k)
    }

    init(unchecked: [UInt8]) { self.bytes = unchecked }

    /// Derives an independent subkey so one key never serves two primitives (AEAD vs MAC).
    public func derive(subkeyID: UInt64, context: String) -> SymmetricKey {
        ensureSodium()
        var ctx = Array(context.utf8.prefix(8))
        while ctx.count < 8 { ctx.append(0x5f) }
        var out = [UInt8](repeating: 0, count: 32)
        ctx.withUnsafeBufferPointer { c in
            c.withMemoryRebound(to: CChar.self) { cc in
                _ = crypto_kdf_derive_from_key(&out, 32, subkeyID, cc.baseAddress!, bytes)
            }
        }
        return SymmetricKey(unchecked: out)
    }
}

/// Authenticated encryption with XChaCha20-Poly1305 (IETF). The output is nonce || ciphertext.
public enum AEAD {
    public static let nonceBytes = 24
    public static let tagBytes = 16
    public static let overhead = nonceBytes + tagBytes

    /// Associated data that binds a ciphertext to its file and purpose: version, purpose, id.
    public static func associatedData(purpose: SealPurpose, fileID: [UInt8], extra: [UInt8] = []) -> [UInt8] {
        // "CF", then the format: 2 for padded purposes, so a value sealed before padding fails
        // to open instead of being read with its last bytes taken for padding.
        var ad: [UInt8] = [0x43, 0x46, purpose.isPadded ? 2 : 1, purpose.rawValue]
        ad.append(UInt8(fileID.count))
        ad += fileID
        ad += extra
        return ad
    }

    public static func seal(
        _ plaintext: [UInt8], key: SymmetricKey, purpose: SealPurpose, fileID: [UInt8], extra: [UInt8] = []
    ) -> [UInt8] {
        plaintext.withUnsafeBytes {
            seal(UnsafeRawBufferPointer($0), key: key, purpose: purpose, fileID: fileID, extra: extra)
        }
    }

    public static func seal(
        _ plaintext: UnsafeRawBufferPointer, key: SymmetricKey, purpose: SealPurpose, fileID: [UInt8],
        extra: [UInt8] = []
    ) -> [UInt8] {
        if purpose.isPadded {
            return Padding.pad(plaintext, purpose: purpose).withUnsafeBytes {
                sealExactly($0, key: key, purpose: purpose, fileID: fileID, extra: extra)
            }
        }
        return sealExactly(plaintext, key: key, purpose: purpose, fileID: fileID, extra: extra)
    }

    static func sealExactly(
        _ plaintext: UnsafeRawBufferPointer, key: SymmetricKey, purpose: SealPurpose, fileID: [UInt8], extra: [UInt8]
    ) -> [UInt8] {
        ensureSodium()
        let ad = associatedData(purpose: purpose, fileID: fileID, extra: extra)
        let nonce = randomBytes(nonceBytes)
        // Written in place, not zero-filled first: for a 256 KiB chunk the fill was a whole
        // extra pass over memory on every write.
        let total = nonceBytes + plaintext.count + tagBytes
        return [UInt8](unsafeUninitializedCapacity: total) { o, initialized in
            guard let base = o.baseAddress else {
                initialized = 0
                return
            }
            for i in 0..<nonceBytes { base[i] = nonce[i] }
            initialized = total
            if plaintext.count >= Bulk.threshold,
                Bulk.sealXChaCha(plaintext, ad: ad, nonce: nonce, key: key.bytes, into: base + nonceBytes)
            {
                return
            }
            var clen: UInt64 = 0
            _ = crypto_aead_xchacha20poly1305_ietf_encrypt(
                base + nonceBytes, &clen,
                plaintext.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(plaintext.count),
                ad, UInt64(ad.count), nil, nonce, key.bytes)
        }
    }

    public static func open(
        _ sealed: [UInt8], key: SymmetricKey, purpose: SealPurpose, fileID: [UInt8], extra: [UInt8] = [], what: String
    ) throws -> [UInt8] {
        guard sealed.count >= overhead else { throw CryptoError.authenticationFailed(what) }
        let length = sealed.count - overhead
        var opened = false
        // Written by the decryption, not zeroed first (a 256 KiB chunk's memset saved per read).
        let out = [UInt8](unsafeUninitializedCapacity: length) { o, count in
            opened = sealed.withUnsafeBytes { s in
                open(s, into: o.baseAddress, key: key, purpose: purpose, fileID: fileID, extra: extra)
            }
            count = opened ? length : 0
        }
        guard opened else { throw CryptoError.authenticationFailed(what) }
        return try unpadded(out, purpose: purpose, what: what)
    }

    /// `open` without a second buffer: decrypts `sealed` where it lies and returns where the
    /// plaintext now is (`nonceBytes..<count - tagBytes`). A 256 KiB chunk read back otherwise
    /// costs a fresh buffer and, for a raw chunk, a copy out of it (`ContentCipher.openChunkInPlace`).
    /// If the tag does not verify it throws, and `sealed` may then hold garbage.
    public static func openInPlace(
        _ sealed: inout [UInt8], key: SymmetricKey, purpose: SealPurpose, fileID: [UInt8],
        extra: [UInt8] = [], what: String
    ) throws -> Range<Int> {
        guard sealed.count >= overhead else { throw CryptoError.authenticationFailed(what) }
        guard !purpose.isPadded else {
            sealed = try open(sealed, key: key, purpose: purpose, fileID: fileID, extra: extra, what: what)
            return 0..<sealed.count
        }
        let opened = sealed.withUnsafeMutableBytes { s -> Bool in
            guard let base = s.baseAddress?.assumingMemoryBound(to: UInt8.self) else { return false }
            return open(
                UnsafeRawBufferPointer(s), into: base + nonceBytes, key: key, purpose: purpose,
                fileID: fileID, extra: extra)
        }
        guard opened else { throw CryptoError.authenticationFailed(what) }
        return nonceBytes..<(sealed.count - tagBytes)
    }

    /// Opens `sealed` (nonce, ciphertext, tag; at least `overhead` bytes) into `out`, which may
    /// be where its ciphertext lies (both libraries decrypt in place). True if the tag verified.
    private static func open(
        _ sealed: UnsafeRawBufferPointer, into out: UnsafeMutablePointer<UInt8>?, key: SymmetricKey,
        purpose: SealPurpose, fileID: [UInt8], extra: [UInt8]
    ) -> Bool {
        guard sealed.count >= overhead, let base = sealed.baseAddress?.assumingMemoryBound(to: UInt8.self) else {
            return false
        }
        let ad = associatedData(purpose: purpose, fileID: fileID, extra: extra)
        let nonce = Array(UnsafeBufferPointer(start: base, count: nonceBytes))
        let body = UnsafeRawBufferPointer(rebasing: sealed[nonceBytes...])
        if body.count - tagBytes >= Bulk.threshold, let out {
            switch Bulk.openXChaCha(body, ad: ad, nonce: nonce, key: key.bytes, into: out) {
            case .opened: return true
            case .refused: return false
            case .unavailable: break
            }
        }
        ensureSodium()
        var mlen: UInt64 = 0
        let rc = crypto_aead_xchacha20poly1305_ietf_decrypt(
            out, &mlen, nil, base + nonceBytes, UInt64(body.count), ad, UInt64(ad.count), nonce, key.bytes)
        return rc == 0 && mlen == UInt64(body.count - tagBytes)
    }

    /// Authentic but badly padded: only a key holder could have made it, so it is a bug or a
    /// hostile writer; refused all the same.
    private static func unpadded(_ plaintext: [UInt8], purpose: SealPurpose, what: String) throws -> [UInt8] {
        guard purpose.isPadded else { return plaintext }
        guard let value = Padding.unpad(plaintext) else { throw CryptoError.authenticationFailed(what) }
        return value
    }
}

/// A keyed MAC (BLAKE2b-256) over a name, keyed by a subkey of the parent folder's key. Equal
/// names in one folder give equal MACs, so the server can enforce unique names blindly.
public enum NameMAC {
    public static func mac(name: String, parentKey: SymmetricKey) -> [UInt8] {
        let k = parentKey.derive(subkeyID: 1, context: "cfname")
        return blake2b(Array("coffer-name-v1".utf8) + [0] + Array(name.utf8), key: k.bytes)
    }
}
