// Scalar addition on the GPU: one thread computes c = a + b.
// a, b and c point to device memory; the host copies the inputs there and the result back.
extern "C" __global__ void add(const int *a, const int *b, int *c)
{
    *c = *a + *b;
}
