/// A map that holds at most `capacity` entries, dropping the least recently used ones roughly
/// first: two generations, the young one filled by inserts and hits, the old one dropped whole
/// when the young one reaches half the capacity. O(1) per access, no per-entry bookkeeping (an
/// LRU list would add two pointers to every entry). The vault's tree caches and the mount's
/// inode caches use it, so their memory stays bounded whatever the tree's size.
///
/// ```swift
/// var cache = BoundedCache<Int, String>(capacity: 4)
/// cache[1] = "one"
/// cache[1]  // "one", now among the recently used
/// ```
///
/// Every method is `@inlinable`, so the vault and the mount get it specialized for their types:
/// unspecialized from another module, a cache hit looked up generic metadata each time (a third
/// of a cold `find`'s daemon CPU, measured with perf).
public struct BoundedCache<Key: Hashable, Value> {
    public let capacity: Int
    @usableFromInline var young: [Key: Value] = [:]
    @usableFromInline var old: [Key: Value] = [:]

    @inlinable public init(capacity: Int) { self.capacity = max(capacity, 2) }

    /// A hit moves the entry to the young generation, so what is used survives the next drop.
    @inlinable public subscript(key: Key) -> Value? {
        mutating get {
            if let v = young[key] { return v }
            guard let v = old.removeValue(forKey: key) else { return nil }
            insert(key, v)
            return v
        }
        set {
            if let newValue {
                old[key] = nil
                insert(key, newValue)
            } else {
                young[key] = nil
                old[key] = nil
            }
        }
    }

    /// The entry, without counting as a use.
    @inlinable public func peek(_ key: Key) -> Value? { young[key] ?? old[key] }

    @inlinable public var count: Int { young.count + old.count }

    /// Every entry, in no order, without counting as a use.
    @inlinable public func visitEntries(_ body: (Key, Value) throws -> Void) rethrows {
        for (k, v) in old where young[k] == nil { try body(k, v) }
        for (k, v) in young { try body(k, v) }
    }

    @inlinable public mutating func removeAll() {
        young = [:]
        old = [:]
    }

    @inlinable mutating func insert(_ key: Key, _ value: Value) {
        young[key] = value
        if young.count >= capacity / 2 {
            old = young
            young = [:]
        }
    }
}

extension BoundedCache: Sendable where Key: Sendable, Value: Sendable {}
