// SAXPY, "single-precision a times x plus y": y[i] = a * x[i] + y[i], one element per thread.
// Two loads and one store of 4 bytes for two floating-point operations: bound by memory bandwidth.
extern "C" __global__ void saxpy(int n, float a, const float *x, float *y)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = a * x[i] + y[i];
    }
}
