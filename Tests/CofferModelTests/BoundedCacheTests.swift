import CofferModel
import Testing

@Suite struct BoundedCacheTests {
    /// The cache's bound, and that a recently used entry survives a generation change.
    @Test func keepsAtMostItsCapacityAndWhatIsUsed() {
        var cache = BoundedCache<Int, Int>(capacity: 8)
        for i in 0..<1000 {
            cache[i] = i * 2
            #expect(cache[0] == 0, "used every time, so never dropped")
            #expect(cache.count <= 8)
        }
        #expect(cache[999] == 1998)
        #expect(cache[1] == nil)
        #expect(cache.peek(998) == 1996)
        cache[0] = nil
        #expect(cache[0] == nil)
        cache.removeAll()
        #expect(cache.count == 0)
    }

    /// Every entry is visited once, from both generations, and visiting uses nothing.
    @Test func visitingSeesEachEntryOnce() {
        var cache = BoundedCache<Int, Int>(capacity: 8)
        for i in 0..<6 { cache[i] = i * 10 }  // four moved to the old generation, two young
        _ = cache[1]  // old → young
        var seen: [Int: Int] = [:]
        cache.visitEntries { k, v in
            #expect(seen[k] == nil)
            seen[k] = v
        }
        #expect(seen == Dictionary(uniqueKeysWithValues: (0..<6).map { ($0, $0 * 10) }))
    }
}
