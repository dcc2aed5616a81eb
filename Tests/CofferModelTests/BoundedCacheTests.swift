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
}
