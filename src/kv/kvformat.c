/* kvformat.c - KV-cache vector formats: storage layouts, quantizers, the
 * scalar reference products, the rotation of the tq formats and their
 * Lloyd-Max codebooks. The SIMD products are in kvformat_x86.c and
 * kvformat_arm.c (see kvformat_impl.h); ak_kv_format_get hands those out,
 * ak_kv_format_get_scalar the reference ones below.
 *
 * STORAGE LAYOUT
 * One stored vector is one token's key or value for one KV head of one layer:
 * d values, d even, 2 <= d <= 1024. No header: the block holding vectors
 * records their format and d. Multi-byte fields are little-endian (the code
 * assumes a little-endian host: x86-64, AArch64); "f16" is IEEE binary16.
 * Sizes are exact (no padding); vectors sit at any byte offset. Quantizers
 * are scalar C on every build, so the bytes stored for an input do not
 * depend on the machine. Inputs must be finite.
 *
 *   f32   d x f32                                                  4d bytes
 *   f16   d x f16 (round to nearest even)                          2d bytes
 *   bf16  d x bf16 (the top half of the f32, nearest even)         2d bytes
 *
 * Grouped formats cut the vector into ng = ceil(d/G) groups of G consecutive
 * values; the last group is shorter when G does not divide d (so d < G is a
 * single group of d). A vector is its code stream, then per-group metadata:
 *
 *   q8  G=32  d x int8 q, then ng x f16 s.               d + 2*ng bytes
 *             x = s*q;  s = amax/127 (rounded to f16), q = round(x/s),
 *             |q| <= 127.
 *   q4  G=32  4-bit code stream, then ng x (f16 s, f16 m). d/2 + 4*ng bytes
 *             x = m + s*q, q in 0..15; m = the group min rounded down to
 *             f16, s = (max - m)/15 rounded up to f16, q = round((x-m)/s),
 *             so [min, max] is always covered and no code clips.
 *   q2  G=16  2-bit code stream, then ng x (f16 s, f16 m). ceil(d/4) + 4*ng
 *             bytes; as q4 with q in 0..3, s = (max - m)/3.
 *
 *   tqB (B = 4, 3, 2)  B-bit code stream of d codebook indices, then f16 N.
 *             ceil(B*d/8) + 2 bytes (tq3, d=64: 24 + 2). The vector is stored
 *             in the rotated basis R (below):
 *                 (R x)[i] ~= N/sqrt(d) * c[idx_i]
 *             where c is the B-bit Lloyd-Max codebook of N(0,1) (ascending,
 *             idx 0 = most negative) and N a per-vector scale (see "norm").
 *
 *   tcq3  3-bit code stream of d codes c_0..c_{d-1}, then f16 N: the same
 *             bytes as tq3 (ceil(3d/8) + 2), in the same rotated basis, but
 *             the codes are a path through a trellis (see TRELLIS):
 *                 (R x)[i] ~= N/sqrt(d) * T[w_i],  w_i = c_i*64 + c_{i-1}*8 + c_{i-2}
 *             i.e. w_i is bits [3i-6, 3i+3) of the code stream read as an
 *             integer, bits before the stream being 0 (c_{-1} = c_{-2} = 0),
 *             and T the 512-entry table
 *             ak_kvf_tcq3_table; N is the least-squares scale, as for tq.
 *
 * A b-bit code stream holds code i in bits [b*i, b*i + b) of the stream read
 * as one little-endian integer (bit k is bit k%8 of byte k/8); it takes
 * ceil(b*d/8) bytes. 8 codes take exactly b bytes and 16 codes 2b bytes:
 * the SIMD loops step by those.
 *
 * SPLIT STORAGE. quantize writes, and dequantize reads, a whole vector:
 * its code stream, then its metadata. Blocks keep the two apart (the code
 * streams of a head's vectors in one run, their metadata in another:
 * blockpool.h), so the products (dot, axpy) take a code pointer and a
 * metadata pointer with a stride each; a whole vector is the case
 * (p, stride, p + code bytes, stride). The products read nothing outside
 * those bytes: a SIMD load that would run past a code stream is moved back
 * to end at the stream's end and shifted.
 *
 * ROTATION (tq formats). R = H*S. S is diagonal, S[i][i] = -1 when bit 63
 * of splitmix64 output number i+1 (i = 0, 1, ...) from the seed
 * 0x6167656e746b76 ("agentkv") is set, else +1; the table `signs` below holds
 * those bits for i < 1024 (a test regenerates it). H is the normalized
 * Walsh-Hadamard transform; for d not a power of two, H is block diagonal:
 * d's binary decomposition, largest block first (96 = 64 + 32, 80 = 64 + 16,
 * 112 = 64 + 32 + 16), each block its own WHT scaled by 1/sqrt(block). Each
 * block is orthonormal, so H and R are; H = H^T = H^-1, R^-1 = R^T = S*H.
 * The rotation spreads every vector's energy over all coordinates of a block
 * so that sqrt(d) * (R x/|x|)[i] is close to N(0,1) whatever the input
 * (outlier channels included), which is what the Lloyd-Max codebook assumes.
 *
 * NORM. The per-vector scale N is not |x| but the least-squares scale of the
 * chosen codes: with y = sqrt(d) * R x / |x| and c_i = c[idx_i],
 *     N = |x| * <y, c> / <c, c>
 * i.e. N/sqrt(d) * c is the orthogonal projection of R x on the code vector.
 * Measured on 20000 Gaussian vectors (mean of |x - x^|^2 / |x|^2, which is
 * the per-coordinate MSE of the unit vector scaled to unit variance):
 *                     d=64: tq4    tq3    tq2     d=128: tq4    tq3    tq2
 *   N = |x|               .00918 .03346 .11447         .00932 .03398 .11608
 *   N = |x| sqrt(d)/|c|   .00889 .03284 .11642         .00918 .03382 .11890
 *   (reconstruction keeps the norm |x|)
 *   projection            .00886 .03256 .11291         .00915 .03352 .11530
 * Keeping the norm helps at 4 and 3 bits but hurts at 2, where |c| is
 * furthest from sqrt(d); the projection beats both at every width. It is
 * also exact for vectors whose rotated coordinates all have one magnitude (a
 * spike), and it makes quantize(dequantize(v)) == v: re-quantizing a
 * reconstruction gives back the same codes and the same N (storing |x|
 * would shrink N by |c|/sqrt(d) on every round). A zero vector stores N = 0
 * and codes 0.
 *
 * GROUPS PER TOKEN (q2). KIVI quantizes keys per channel across tokens and
 * values per token. Here every format, for keys and values alike, quantizes
 * groups along the head dimension of one token: each stored vector is then
 * self-contained, so a block is written once and never re-quantized when
 * later tokens arrive, can be shared by reference between sequences, and
 * persisted or handed off as is. Per-token groups of 16 pay 2 bits/value of
 * metadata (4 bits/value in all) to keep the outlier channels of keys from
 * spreading their range over many values.
 *
 * TRELLIS (tcq3). A scalar quantizer snaps each coordinate on its own: at 3
 * bits its best error on N(0,1) is Lloyd-Max's .03455 per coordinate, while
 * the rate-distortion bound at 3 bits is 2^-6 = .0156. Trellis-coded
 * quantization closes part of that gap at the same 3 bits: each value is
 * read from a table of 512 by a window of 9 bits of the code stream (its own
 * code and the two before), so a code chooses among 8 values that depend on
 * the codes before it, and the quantizer picks the whole path of d codes
 * that minimizes the squared error (Viterbi over the 64 states of two codes:
 * 64 x 8 candidates per coordinate, about 30k operations per vector of 64).
 * Decoding is a table look-up per value, as cheap as tq3's. The table is a
 * constant, trained once offline on N(0,1) (bench/tcq3_table.c: alternate
 * Viterbi encoding of 20000 random unit vectors of d=64 scaled to norm
 * sqrt(64) and moving each entry to the mean of the values coded with it,
 * from a table of N(0,1) draws); measured error per coordinate of a unit
 * vector scaled to unit variance, projection norm: .0224 at d=64 against
 * tq3's .0326 (tested). Unlike tq, re-quantizing a reconstruction need not
 * give back the same bytes (the Viterbi path of a rescaled path may differ).
 *
 * LLOYD-MAX. The codebooks are the fixed points of Lloyd's algorithm on the
 * N(0,1) density (ak_lloyd_max_derive); the float constants below are its
 * output, rounded (a test compares them). Expected squared error per
 * coordinate: 2 bits .1175, 3 bits .03455, 4 bits .009501.
 */
#include "kv/kvformat.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kv/kvformat_impl.h"
#include "kv/kvformat_quant.h"
#include "base/util.h"

/* The quantizers' element-wise loops (rotation butterflies, sign flips,
 * code packing, f16 decoding) vectorized by GCC at -O3 where the build is
 * -O2: the same operations in the same order per element, so the same bits
 * (no reassociation, no fast-math). */
#if defined(__GNUC__) && !defined(__clang__)
#define AK_VECTORIZE __attribute__((optimize("O3")))
#else
#define AK_VECTORIZE
#endif

/* ------------------------------------------------------------------------ */
/* Constant tables                                                          */
/* ------------------------------------------------------------------------ */

const float ak_kvf_lm2[4] = { -1.510417609f, -0.452780035f, 0.452780035f, 1.510417609f };
const float ak_kvf_lm3[8] = { -2.151945705f, -1.343909279f, -0.756005282f, -0.245094179f,
                              0.245094179f,  0.756005282f,  1.343909279f,  2.151945705f };
const float ak_kvf_lm4[16] = { -2.732589573f, -2.069017229f, -1.618046389f, -1.256231200f,
                               -0.942340459f, -0.656759120f, -0.388048301f, -0.128395030f,
                               0.128395030f,  0.388048301f,  0.656759120f,  0.942340459f,
                               1.256231200f,  1.618046389f,  2.069017229f,  2.732589573f };

/* tcq3's values by window w_i (layout above): the output of
 * bench/tcq3_table.c (40 rounds, 20000 training vectors). */
const float ak_kvf_tcq3_table[512] = {
    -1.84298468f, -1.13263798f, 1.39116251f, 0.136867478f, -0.263106555f, 0.416766286f, 0.0256974511f, 0.624457479f,
    -1.15054727f, -1.5098033f, 0.565124869f, -0.722212911f, -0.286347508f, -1.19079065f, -1.11604619f, -0.738378227f,
    0.501065552f, 0.00869444199f, -1.23473275f, -0.477514148f, 1.3622241f, -0.172542855f, -0.618133664f, -0.704723239f,
    0.720827937f, 0.771726787f, 0.27382946f, -0.0637309477f, 1.51877499f, -0.315338194f, -1.15808964f, -0.332507074f,
    0.240588754f, 1.56113791f, -0.267470241f, -1.82703125f, -0.736988842f, 0.143140689f, -0.0686374307f, 0.389884472f,
    -2.26854634f, 0.553454816f, -2.00793123f, 1.22194421f, -1.30580044f, -0.110633224f, -1.50402474f, 0.384334594f,
    2.33914733f, 1.55512905f, 1.03024912f, 1.93998432f, -1.30402374f, 1.04566419f, 0.665445924f, -0.747257054f,
    -0.0794859231f, 0.85672015f, -1.95493567f, 0.522202015f, -0.832947671f, -1.523996f, -0.303537995f, 1.66730165f,
    -0.00466561504f, 0.145462275f, 2.01176953f, 1.24009085f, 0.262166291f, 1.44782948f, 1.83444035f, -1.35711062f,
    -0.338899165f, -0.876929998f, -1.54160583f, -1.07945287f, 0.348739088f, -0.672403038f, 1.84841669f, -0.30156967f,
    0.0295914821f, -0.456158042f, 0.458396196f, 0.866961777f, -1.21083879f, 0.181135774f, -0.287023425f, -0.357362986f,
    -0.125656232f, 1.16930938f, 1.47737205f, -1.14888513f, 0.597885251f, 0.316359073f, -0.577429473f, 0.2722947f,
    -2.47800207f, 0.412055522f, 0.0758589879f, -0.273482531f, 0.0865315795f, -1.84387827f, -0.666654527f, -1.09556973f,
    1.24096107f, 0.0182280075f, 0.653457344f, 0.0812795162f, 0.795066953f, -1.21804547f, 2.18493032f, 0.953678071f,
    -0.274848819f, -0.903312087f, -2.14714408f, 0.159128979f, -0.728428364f, -0.686585724f, -0.381803602f, -2.76558995f,
    -0.740069926f, -2.55644321f, 0.168359444f, 0.266535193f, -0.134629637f, -0.48522827f, -2.03176928f, 0.566946208f,
    0.394316196f, -0.309695512f, -1.65305221f, -0.365470797f, -0.886773884f, -1.30779088f, 0.600467026f, 0.939668536f,
    1.70461357f, 0.660511017f, 0.249998525f, 0.660400331f, 0.0274844877f, 0.268692434f, 0.906550467f, -0.293658793f,
    -0.800265074f, -0.980039775f, -0.0368843153f, 2.29771996f, -0.149921909f, 0.568515718f, -1.53468394f, 0.204329491f,
    1.71241403f, -0.219908863f, -1.58046579f, 2.2586565f, 0.134237424f, -0.686264873f, -1.70748997f, 0.546777964f,
    -1.38552713f, -1.54194999f, -1.09736884f, 0.823246121f, -1.87924683f, 0.970131397f, -0.254367799f, 0.698391914f,
    0.191111416f, -1.45070469f, -0.679729044f, -0.134407148f, 0.439676344f, 1.44526064f, -0.961127996f, -0.0424717441f,
    -1.55101514f, 0.667575359f, -0.619760692f, -1.23442674f, 1.45317411f, -0.232646242f, -1.86139286f, -1.02618623f,
    0.810496151f, -0.874079347f, -0.706516504f, -0.0945730433f, -0.458600879f, 0.395822734f, -1.15480125f, 1.12879348f,
    0.847050488f, -1.80376697f, 0.623521507f, -0.763753593f, -3.27369046f, -0.381841004f, 1.22978687f, 0.276211977f,
    0.916880488f, 1.11695004f, 0.796593904f, -0.486394942f, 1.17980647f, -0.0948019549f, -0.0494897738f, 0.408111185f,
    -0.351593167f, -2.54840875f, -0.484205127f, 0.470427424f, -1.76258671f, 2.5913763f, -0.975708783f, -0.0474644788f,
    -0.994772434f, -0.543531597f, -0.0328112468f, 1.11688375f, 2.4295764f, 0.655080736f, 1.67608404f, -0.787348807f,
    1.32065761f, 0.784886301f, 0.471314549f, 1.60161912f, -0.954369307f, 0.404255301f, 0.936533451f, -0.234239206f,
    0.660388768f, 2.31442809f, -0.277886063f, 0.335457116f, 1.39684951f, -0.655804038f, 0.211615458f, 3.25557756f,
    0.761193216f, 0.296973675f, -0.296998143f, 0.872914016f, -0.0113575263f, 0.384904861f, 1.2016933f, -0.226198643f,
    1.20002329f, -0.0175536387f, -1.46452105f, 1.80589938f, -1.14618278f, 1.4847343f, -0.792220175f, -0.0822685435f,
    2.01041961f, -0.139017582f, -0.0412274487f, 0.866412699f, 0.624504745f, 0.0195186231f, 0.34224245f, -0.688402057f,
    -1.99676549f, -0.448896319f, -0.418279082f, -0.188179404f, -1.15539908f, 1.20153129f, 1.25386775f, 0.132527888f,
    -1.31387901f, 0.50704968f, -0.758870542f, 0.101148389f, 0.874088824f, 2.05784011f, 0.817910552f, 1.65565884f,
    -0.589646757f, 0.107142583f, -0.275767654f, 0.38310644f, 1.20238662f, 1.69256938f, 0.80919075f, -1.16668785f,
    0.649878919f, -0.109900743f, -0.494757712f, 0.143839329f, 1.06856596f, -2.93757057f, 0.491254956f, -1.61447203f,
    -0.286151797f, 1.18102467f, 0.342086136f, 0.796300471f, -0.506757438f, -2.46241021f, -0.168371499f, -0.941121876f,
    -0.603601396f, -1.36206985f, -1.03409696f, -0.677661896f, -0.362582117f, 0.158299327f, -0.0809596181f, 0.308690131f,
    -1.30405152f, 0.419472337f, -0.92205596f, -0.675574481f, 0.78787744f, 0.97659862f, 0.101052135f, 0.196415141f,
    -1.00015521f, -0.742852569f, 0.340637356f, -2.37102509f, -1.58820808f, 0.881643593f, -1.62118447f, 1.87350857f,
    0.407947868f, 0.313945413f, 1.15142667f, 0.117837988f, 1.79793477f, -1.88810945f, -0.489283353f, 0.784606457f,
    1.40912187f, 1.36519468f, 0.924424052f, -0.252068639f, 0.314601958f, 1.02752721f, 0.107014082f, 0.7065835f,
    -1.76012993f, 0.246419698f, -0.989823222f, 1.64192486f, -0.30821225f, 0.00582830841f, 0.477814645f, 0.963065445f,
    -0.634117067f, 2.11582184f, 1.68267298f, -1.29730201f, -0.256186068f, 1.46881306f, 0.247927919f, -0.593011737f,
    -0.890039206f, -2.07966781f, 1.23432577f, -0.337273538f, 0.0887938291f, 0.395209551f, -0.519792378f, -1.55490768f,
    -0.930555582f, -0.121176831f, 0.574892223f, 0.453339159f, 0.167245507f, -1.45500576f, 2.81649399f, 0.955329537f,
    -0.39831695f, -1.37840497f, -0.0971615165f, 1.15889513f, 0.420126855f, -0.929074764f, -0.545043945f, 0.792047024f,
    1.35549021f, -0.668478966f, 1.00800097f, -1.6498152f, -1.20200396f, -2.25384879f, 0.850990593f, -0.110903926f,
    -0.00291703944f, 0.141452253f, 0.0962952375f, 1.06485963f, 0.708723366f, 1.99087012f, 0.446784467f, 1.36808372f,
    2.62471676f, -0.505254805f, -0.16416423f, -0.914977849f, -0.818226874f, 1.50871718f, 0.398253679f, 0.531663835f,
    0.263083398f, -1.10596383f, 0.656805158f, -0.711268842f, 0.940938115f, -1.24309051f, -0.245566294f, -0.423632711f,
    1.00281477f, -0.641437232f, 0.922511935f, -0.529191732f, 1.80213833f, -1.19607615f, -1.98189676f, 1.40689147f,
    -1.44174361f, -0.431969285f, -1.09862792f, 0.480992109f, -0.84687829f, 2.15200996f, 0.832651854f, 1.54298246f,
    0.268514961f, -0.500224948f, -1.53231883f, -0.199300945f, 0.556767642f, -1.0003463f, 0.256808519f, -2.14541078f,
    0.484572589f, 1.28378999f, -0.549977183f, -0.375539094f, 0.170008272f, -0.074864246f, 0.71974194f, -1.00087106f,
    -0.43859449f, 0.55961293f, -0.385941714f, -1.11478448f, -0.622887969f, -0.853809178f, -0.376856178f, 1.27450776f,
    -0.733632088f, -0.126223341f, -2.29547834f, -1.58595514f, -0.595930874f, 0.714907825f, -0.868335724f, -1.2433418f,
    0.676416159f, 0.027660761f, 0.352326959f, 1.50965989f, -0.468336165f, -0.525038123f, -0.127529547f, 1.09914052f,
    1.13019609f, 0.582362413f, -0.59072715f, 0.66644907f, 1.83896148f, 1.07937849f, -0.929000139f, 0.0379664488f,
    1.8911438f, 1.00629711f, -0.760438025f, -0.892351151f, 0.505751669f, -0.409047127f, 1.35022712f, 0.0156293418f,
    1.94716215f, -0.963504553f, 0.0880498365f, -0.648329079f, -0.154016346f, 0.837006271f, 1.34782839f, 2.25947571f,
    -0.0497681759f, 1.03367889f, 0.140217528f, 1.41932964f, 0.919672787f, -2.2013948f, -0.80661273f, -1.51292062f,
    0.244476885f, -0.421645612f, -1.1918534f, -1.20409465f, -1.8873297f, 2.76278901f, -1.53645515f, -0.497561991f,
};

/* Bit i%64 of signs[i/64] set: S[i][i] = -1 (see ROTATION above). */
static const uint64_t signs[AK_KVF_MAX_D / 64] = {
    0x1f7886af841af02aULL, 0x9be5bc192d8fc008ULL, 0x3395c57db907c1e8ULL, 0x0c440697766d7e53ULL,
    0xebbee4e6e81ebec0ULL, 0xa5cd2ad8a60a6796ULL, 0x73d79dce38147261ULL, 0x37da94088f216eefULL,
    0xe44232f64a7b0c20ULL, 0xaba867299c7f807eULL, 0x1ddf6598f2a2bf59ULL, 0xd7158529e14f0805ULL,
    0x2245c52009b565b9ULL, 0x8d261d3d7655f8c8ULL, 0x779430791217b4feULL, 0x00944110d4aee048ULL,
};

const float *ak_lloyd_max_centroids(int bits) {
    return bits == 2 ? ak_kvf_lm2 : bits == 3 ? ak_kvf_lm3 : bits == 4 ? ak_kvf_lm4 : NULL;
}

static int valid_d(int d) { return d >= 2 && d <= AK_KVF_MAX_D && d % 2 == 0; }

/* ------------------------------------------------------------------------ */
/* Small helpers                                                            */
/* ------------------------------------------------------------------------ */

static void wr16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

/* IEEE half to float, inline (ak_f16_to_f32 is the same function out of
 * line; the reference products call this once per value). The exponent and
 * mantissa shifted into place read as a float 2^-112 times the value,
 * subnormals included; inf and NaN are set apart. */
static inline float h2f(uint16_t h) {
    uint32_t em = h & 0x7fffu, bits = em << 13;
    float f;
    memcpy(&f, &bits, 4);
    f *= 0x1p112f;
    memcpy(&bits, &f, 4);
    if (em >= 0x7c00u) bits = 0x7f800000u | (em & 0x3ffu) << 13;
    bits |= (uint32_t)(h & 0x8000u) << 16;
    memcpy(&f, &bits, 4);
    return f;
}

/* The next f16 below / above h (h finite). */
static uint16_t f16_down(uint16_t h) { return h == 0 ? 0x8001 : (h & 0x8000) ? h + 1 : h - 1; }
static uint16_t f16_up(uint16_t h) { return h == 0x8000 ? 0x0001 : (h & 0x8000) ? h - 1 : h + 1; }
/* The largest f16 <= x and the smallest f16 >= x, for |x| <= 65504. */
static uint16_t f16_floor(float x) {
    uint16_t h = ak_f32_to_f16(x);
    return ak_f16_to_f32(h) > x ? f16_down(h) : h;
}
static uint16_t f16_ceil(float x) {
    uint16_t h = ak_f32_to_f16(x);
    return ak_f16_to_f32(h) < x ? f16_up(h) : h;
}
static float clamp_f16_range(float x) { return x > 65504.0f ? 65504.0f : x < -65504.0f ? -65504.0f : x; }

/* Writes n codes of b bits (each < 2^b) as a code stream (see the layout). */
AK_VECTORIZE static void pack_codes(const uint8_t *code, int n, int b, uint8_t *dst) {
    memset(dst, 0, ak_kvf_code_bytes(n, b));
    int i = 0;
    /* whole bytes of 4-bit and 2-bit codes at once (the loop below, unrolled) */
    if (b == 4)
        for (; i + 2 <= n; i += 2) dst[i >> 1] = (uint8_t)(code[i] | code[i + 1] << 4);
    else if (b == 2)
        for (; i + 4 <= n; i += 4)
            dst[i >> 2] = (uint8_t)(code[i] | code[i + 1] << 2 | code[i + 2] << 4 | code[i + 3] << 6);
    for (; i < n; i++) {
        int bit = i * b;
        unsigned v = (unsigned)code[i] << (bit & 7);
        dst[bit >> 3] |= (uint8_t)v;
        if ((bit & 7) + b > 8) dst[(bit >> 3) + 1] |= (uint8_t)(v >> 8);
    }
}

/* Reads n codes of b bits (b <= 8) from a code stream: whole runs of 8 codes
 * (b bytes) as one integer, then the tail code by code. */
static void unpack_codes(const uint8_t *src, int n, int b, uint8_t *code) {
    unsigned mask = (1u << b) - 1;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const uint8_t *p = src + (size_t)(i / 8) * b;
        uint64_t w = 0;
        for (int k = 0; k < b; k++) w |= (uint64_t)p[k] << (8 * k);
        for (int k = 0; k < 8; k++) code[i + k] = (uint8_t)((w >> (b * k)) & mask);
    }
    for (; i < n; i++) {
        int bit = i * b;
        unsigned v = src[bit >> 3];
        if ((bit & 7) + b > 8) v |= (unsigned)src[(bit >> 3) + 1] << 8;
        code[i] = (uint8_t)((v >> (bit & 7)) & mask);
    }
}

/* ------------------------------------------------------------------------ */
/* Rotation                                                                 */
/* ------------------------------------------------------------------------ */

/* In-place normalized Walsh-Hadamard transform of m = 2^k values
 * (kvformat_quant.h: SIMD where the build has it, the same bits). */
static void wht(float *x, int m) { ak_kvq_wht(x, m); }

/* H: one WHT per block of d's binary decomposition, largest first. */
static void wht_blocks(float *x, int d) {
    int off = 0;
    for (int m = AK_KVF_MAX_D; m >= 2; m >>= 1)
        if (d & m) {
            wht(x + off, m);
            off += m;
        }
}

AK_VECTORIZE static void apply_signs(float *x, int d) {
    for (int i = 0; i < d; i++)
        if ((signs[i >> 6] >> (i & 63)) & 1) x[i] = -x[i];
}

void ak_kv_rotate(float *x, int d) {
    if (!valid_d(d)) return;
    apply_signs(x, d);
    wht_blocks(x, d);
}

void ak_kv_unrotate(float *x, int d) {
    if (!valid_d(d)) return;
    wht_blocks(x, d);
    apply_signs(x, d);
}

/* ------------------------------------------------------------------------ */
/* Formats: sizes                                                           */
/* ------------------------------------------------------------------------ */

/* Per-format constants: code bits, group size (0: none), metadata bytes per
 * group (or per vector for tq), codebook. */
typedef struct {
    int bits, group, meta;
    const float *cb;
} fmt_shape;

static fmt_shape shape(ak_kv_format f) {
    switch (f) {
    case AK_KV_F32: return (fmt_shape){ 32, 0, 0, NULL };
    case AK_KV_F16:
    case AK_KV_BF16: return (fmt_shape){ 16, 0, 0, NULL };
    case AK_KV_Q8: return (fmt_shape){ 8, AK_KVF_Q8_G, 2, NULL };
    case AK_KV_Q4: return (fmt_shape){ 4, AK_KVF_Q4_G, 4, NULL };
    case AK_KV_Q2: return (fmt_shape){ 2, AK_KVF_Q2_G, 4, NULL };
    case AK_KV_TQ4: return (fmt_shape){ 4, 0, 2, ak_kvf_lm4 };
    case AK_KV_TQ3: return (fmt_shape){ 3, 0, 2, ak_kvf_lm3 };
    case AK_KV_TQ2: return (fmt_shape){ 2, 0, 2, ak_kvf_lm2 };
    case AK_KV_TCQ3: return (fmt_shape){ 3, 0, 2, NULL };
    default: return (fmt_shape){ 0, 0, 0, NULL };
    }
}

/* Stored in the rotated basis R. */
static int rotated(ak_kv_format f) { return f == AK_KV_TQ4 || f == AK_KV_TQ3 || f == AK_KV_TQ2 || f == AK_KV_TCQ3; }

static size_t vec_bytes(ak_kv_format f, int d) {
    fmt_shape s = shape(f);
    size_t meta = s.group ? (size_t)ak_kvf_ngroups(d, s.group) * s.meta : (size_t)s.meta;
    return ak_kvf_code_bytes(d, s.bits) + meta;
}

/* ------------------------------------------------------------------------ */
/* Quantizers                                                               */
/* ------------------------------------------------------------------------ */

static void quant_q8(const float *x, int d, uint8_t *dst) {
    int8_t *q = (int8_t *)dst;
    uint8_t *meta = dst + d;
    for (int g0 = 0, g = 0; g0 < d; g0 += AK_KVF_Q8_G, g++) {
        int n = g0 + AK_KVF_Q8_G < d ? AK_KVF_Q8_G : d - g0;
        float amax = ak_kvq_absmax(x + g0, n);
        /* quantize against the stored (f16) scale, which reconstruction uses */
        uint16_t sh = ak_f32_to_f16(fminf(amax / 127.0f, 65504.0f));
        ak_kvq_q8_codes(x + g0, n, ak_f16_to_f32(sh), q + g0);
        wr16(meta + 2 * g, sh);
    }
}

/* q4 and q2: affine b-bit codes in groups of G. */
static void quant_affine(const float *x, int d, int b, int G, uint8_t *dst) {
    uint8_t code[AK_KVF_MAX_D];
    uint8_t *meta = dst + ak_kvf_code_bytes(d, b);
    float top = (float)((1 << b) - 1);
    for (int g0 = 0, g = 0; g0 < d; g0 += G, g++) {
        int n = g0 + G < d ? G : d - g0;
        float mn, mx;
        ak_kvq_minmax(x + g0, n, &mn, &mx);
        uint16_t mh = f16_floor(clamp_f16_range(mn));
        float m = ak_f16_to_f32(mh);
        float s0 = (clamp_f16_range(mx) - m) / top;
        uint16_t sh = s0 > 0 ? f16_ceil(fminf(s0, 65504.0f)) : 0;
        float s = ak_f16_to_f32(sh);
        ak_kvq_affine_codes(x + g0, n, m, s, top, code + g0);
        wr16(meta + 4 * g, sh);
        wr16(meta + 4 * g + 2, mh);
    }
    pack_codes(code, d, b, dst);
}

/* y = sqrt(d) R x / |x|: x rotated and scaled so that its coordinates have
 * unit variance (what the tq and tcq3 codebooks are fitted to). Returns |x|,
 * or 0 (y untouched) when x is zero or not finite. */
AK_VECTORIZE static double rotate_to_unit_variance(const float *x, int d, float *y) {
    double n2 = 0;
    for (int i = 0; i < d; i++) n2 += (double)x[i] * x[i];
    double n = sqrt(n2);
    if (!(n > 0 && isfinite(n))) return 0;
    memcpy(y, x, (size_t)d * sizeof(float));
    ak_kv_rotate(y, d);
    float sc = (float)(sqrt((double)d) / n);
    for (int i = 0; i < d; i++) y[i] *= sc;
    return n;
}

static void quant_tq(const float *x, int d, int b, const float *cb, uint8_t *dst) {
    int K = 1 << b;
    float y[AK_KVF_MAX_D], bound[15];
    uint8_t code[AK_KVF_MAX_D];
    for (int k = 0; k + 1 < K; k++) bound[k] = 0.5f * (cb[k] + cb[k + 1]);
    double n = rotate_to_unit_variance(x, d, y);
    uint16_t nh = 0;
    memset(code, 0, sizeof code);
    if (n > 0) {
        double yc = 0, cc = 0;
        ak_kvq_bucket_codes(y, d, bound, K - 1, code);   /* nearest centroid */
        for (int i = 0; i < d; i++) {
            yc += (double)y[i] * cb[code[i]];
            cc += (double)cb[code[i]] * cb[code[i]];
        }
        nh = ak_f32_to_f16((float)fmin(n * yc / cc, 65504.0));   /* the projection (NORM above) */
    }
    uint8_t *p = dst;
    pack_codes(code, d, b, p);
    wr16(p + ak_kvf_code_bytes(d, b), nh);
}

/* tcq3 (TRELLIS above): y = sqrt(d) R x/|x|; the Viterbi path of codes that
 * minimizes sum (y_i - T[w_i])^2 from the state "two zero codes"; N the
 * projection of R x on the path's values. Floats, strict comparisons, fixed
 * order (lowest state and code win ties): the same bytes on every build. */
static void quant_tcq3(const float *x, int d, uint8_t *dst) {
    enum { NS = 64 };   /* states: the last two codes */
    const float *T = ak_kvf_tcq3_table;   /* indexed by w_i (layout above) */
    float y[AK_KVF_MAX_D], cost[NS], nc[NS];
    uint8_t from[AK_KVF_MAX_D][NS];   /* back pointers: the previous state; 64 KiB at d = 1024 */
    uint8_t code[AK_KVF_MAX_D];
    double n = rotate_to_unit_variance(x, d, y);
    uint16_t nh = 0;
    memset(code, 0, sizeof code);
    if (n > 0) {
        for (int s = 0; s < NS; s++) cost[s] = s ? INFINITY : 0.0f;
        /* State ns = (a, c) (codes i-1, i) is reached from s = (b, a) for
         * the 8 codes b at i-2, through the window w = b*64 + ns. b runs
         * outermost and ascending (ties go to the lowest s), and the loops
         * over the 64 states are branch-free so the compiler vectorizes
         * them (exact float ops in a fixed order: the same result). */
        float tb[512];   /* T by (b, a, c) = (w >> 6, w >> 3 & 7, w & 7): c_{i-2}, c_{i-1}, c_i */
        for (int w = 0; w < 512; w++) tb[w] = T[(w & 7) << 6 | (w & 0x38) | w >> 6];
        for (int i = 0; i < d; i++) {
            float e2[512];
            int32_t fr[NS];
            for (int w = 0; w < 512; w++) {
                float e = y[i] - tb[w];
                e2[w] = e * e;
            }
            for (int ns = 0; ns < NS; ns++) {
                nc[ns] = INFINITY;
                fr[ns] = 0;
            }
            for (int b = 0; b < 8; b++)
                for (int a = 0; a < 8; a++) {
                    const int s = b << 3 | a;
                    const float cs = cost[s];
                    float *nca = nc + (a << 3);
                    int32_t *fra = fr + (a << 3);
                    const float *e2a = e2 + (b << 6 | a << 3);
                    for (int c = 0; c < 8; c++) {   /* ns = a*8 + c */
                        float v = cs + e2a[c];
                        int better = v < nca[c];
                        nca[c] = better ? v : nca[c];
                        fra[c] = better ? s : fra[c];
                    }
                }
            for (int ns = 0; ns < NS; ns++) from[i][ns] = (uint8_t)fr[ns];
            memcpy(cost, nc, sizeof cost);
        }
        int best = 0;
        for (int s = 1; s < NS; s++)
            if (cost[s] < cost[best]) best = s;
        for (int i = d - 1, s = best; i >= 0; i--) {
            code[i] = (uint8_t)(s & 7);
            s = from[i][s];
        }
        double yc = 0, cc = 0;
        for (int i = 0, w = 0; i < d; i++) {
            w = w >> 3 | code[i] << 6;
            yc += (double)y[i] * T[w];
            cc += (double)T[w] * T[w];
        }
        if (cc > 0 && yc > 0) nh = ak_f32_to_f16((float)fmin(n * yc / cc, 65504.0));
    }
    pack_codes(code, d, 3, dst);
    wr16(dst + ak_kvf_code_bytes(d, 3), nh);
}

/* Out-of-contract d (odd, < 2, > 1024) writes nothing, here and below. */
static void quantize(ak_kv_format f, const float *x, int d, void *dst) {
    uint8_t *p = dst;
    if (!valid_d(d)) return;
    switch (f) {
    case AK_KV_F32: memcpy(p, x, (size_t)d * sizeof(float)); break;
    case AK_KV_F16:
        for (int i = 0; i < d; i++) wr16(p + 2 * i, ak_f32_to_f16(x[i]));
        break;
    case AK_KV_BF16:
        for (int i = 0; i < d; i++) wr16(p + 2 * i, ak_f32_to_bf16(x[i]));
        break;
    case AK_KV_Q8: quant_q8(x, d, p); break;
    case AK_KV_Q4: quant_affine(x, d, 4, AK_KVF_Q4_G, p); break;
    case AK_KV_Q2: quant_affine(x, d, 2, AK_KVF_Q2_G, p); break;
    case AK_KV_TQ4: quant_tq(x, d, 4, ak_kvf_lm4, p); break;
    case AK_KV_TQ3: quant_tq(x, d, 3, ak_kvf_lm3, p); break;
    case AK_KV_TQ2: quant_tq(x, d, 2, ak_kvf_lm2, p); break;
    case AK_KV_TCQ3: quant_tcq3(x, d, p); break;
    default: break;
    }
}

/* ------------------------------------------------------------------------ */
/* Decoding (stored basis) and the scalar reference products                */
/* ------------------------------------------------------------------------ */

/* y = the stored vector in its stored basis (rotated for tq formats), from
 * its code stream p and its metadata meta. */
AK_VECTORIZE static void decode(ak_kv_format f, const uint8_t *p, const uint8_t *meta, int d, float *y) {
    fmt_shape s = shape(f);
    uint8_t code[AK_KVF_MAX_D];
    switch (f) {
    case AK_KV_F32: memcpy(y, p, (size_t)d * sizeof(float)); break;
    case AK_KV_F16:
        for (int i = 0; i < d; i++) y[i] = h2f(ak_kvf_rd16(p + 2 * i));
        break;
    case AK_KV_BF16:
        for (int i = 0; i < d; i++) y[i] = ak_bf16_to_f32(ak_kvf_rd16(p + 2 * i));
        break;
    case AK_KV_Q8:
        for (int g0 = 0; g0 < d; g0 += s.group) {
            float sc = h2f(ak_kvf_rd16(meta + 2 * (g0 / s.group)));
            for (int i = g0; i < g0 + s.group && i < d; i++) y[i] = sc * (float)(int8_t)p[i];
        }
        break;
    case AK_KV_Q4:
    case AK_KV_Q2:
        unpack_codes(p, d, s.bits, code);
        for (int g0 = 0; g0 < d; g0 += s.group) {
            const uint8_t *gm = meta + 4 * (g0 / s.group);
            float sc = h2f(ak_kvf_rd16(gm)), mn = h2f(ak_kvf_rd16(gm + 2));
            for (int i = g0; i < g0 + s.group && i < d; i++) y[i] = mn + sc * (float)code[i];
        }
        break;
    case AK_KV_TQ4:
    case AK_KV_TQ3:
    case AK_KV_TQ2: {
        float fac = ak_kvf_tq_factor(ak_kvf_rd16(meta), d);
        unpack_codes(p, d, s.bits, code);
        for (int i = 0; i < d; i++) y[i] = fac * s.cb[code[i]];
        break;
    }
    case AK_KV_TCQ3: {
        float fac = ak_kvf_tq_factor(ak_kvf_rd16(meta), d);
        unpack_codes(p, d, 3, code);
        for (int i = 0, w = 0; i < d; i++) {
            w = w >> 3 | code[i] << 6;
            y[i] = fac * ak_kvf_tcq3_table[w];
        }
        break;
    }
    default: memset(y, 0, (size_t)d * sizeof(float)); break;
    }
}

static void dequantize(ak_kv_format f, const void *src, int d, float *y) {
    if (!valid_d(d)) return;
    decode(f, src, (const uint8_t *)src + ak_kvf_code_bytes(d, shape(f).bits), d, y);
    if (rotated(f)) ak_kv_unrotate(y, d);
}

/* The scalar references of the table's dot and axpy (kvformat.h) on the
 * vectors vs; nothing for an invalid d. vs by value: the compiler then
 * passes its fields in registers. */
static void dot_scalar(ak_kv_format f, const ak_kvf_vecs vs, const float *q, int d, float *out) {
    float y[AK_KVF_MAX_D];
    const uint8_t *codes = vs.codes, *meta = vs.meta;
    const size_t cstride = vs.cstride, mstride = vs.mstride;
    const int n = vs.n;
    if (!valid_d(d)) return;
    for (int j = 0; j < n; j++) {
        decode(f, codes + (size_t)j * cstride, meta ? meta + (size_t)j * mstride : NULL, d, y);
        float s[8] = { 0 };   /* 8 chains, not one: no wait on each add (and SIMD-able) */
        int i = 0;
        for (; i + 8 <= d; i += 8)
            for (int k = 0; k < 8; k++) s[k] += q[i + k] * y[i + k];
        for (; i < d; i++) s[0] += q[i] * y[i];
        out[j] = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    }
}

static void axpy_scalar(ak_kv_format f, const ak_kvf_vecs vs, const float *w, int d, float *acc) {
    float y[AK_KVF_MAX_D];
    const uint8_t *codes = vs.codes, *meta = vs.meta;
    const size_t cstride = vs.cstride, mstride = vs.mstride;
    const int n = vs.n;
    if (!valid_d(d)) return;
    for (int j = 0; j < n; j++) {
        decode(f, codes + (size_t)j * cstride, meta ? meta + (size_t)j * mstride : NULL, d, y);
        float wj = w[j];   /* hoisted: w may alias acc as far as the compiler knows */
        for (int i = 0; i < d; i++) acc[i] += wj * y[i];
    }
}

/* The table's per-format entry points. */
#define ENTRY_POINTS(F, ID)                                                                                   \
    static size_t vec_bytes_##F(int d) { return vec_bytes(ID, d); }                                           \
    static void quantize_##F(const float *x, int d, void *dst) { quantize(ID, x, d, dst); }                   \
    static void dequantize_##F(const void *src, int d, float *y) { dequantize(ID, src, d, y); }               \
    static void dot_##F(const void *c, size_t cs, const void *m, size_t ms, int n, const float *q, int d,     \
                        float *out) {                                                                         \
        dot_scalar(ID, (ak_kvf_vecs){.codes = c, .cstride = cs, .meta = m, .mstride = ms, .n = n}, q, d, out); \
    }                                                                                                         \
    static void axpy_##F(const void *c, size_t cs, const void *m, size_t ms, int n, const float *w, int d,    \
                         float *acc) {                                                                        \
        axpy_scalar(ID, (ak_kvf_vecs){.codes = c, .cstride = cs, .meta = m, .mstride = ms, .n = n}, w, d, acc); \
    }
ENTRY_POINTS(f32, AK_KV_F32)
ENTRY_POINTS(f16, AK_KV_F16)
ENTRY_POINTS(bf16, AK_KV_BF16)
ENTRY_POINTS(q8, AK_KV_Q8)
ENTRY_POINTS(q4, AK_KV_Q4)
ENTRY_POINTS(q2, AK_KV_Q2)
ENTRY_POINTS(tq4, AK_KV_TQ4)
ENTRY_POINTS(tq3, AK_KV_TQ3)
ENTRY_POINTS(tq2, AK_KV_TQ2)
ENTRY_POINTS(tcq3, AK_KV_TCQ3)
#undef ENTRY_POINTS

/* tcq3's products in plain C for back ends without a gather (NEON): each
 * vector's values decoded into a small array, the window kept in a
 * register, and a dot or axpy the compiler vectorizes. */
static void tcq3_values(const uint8_t *p, const uint8_t *meta, int d, float *y) {
    float fac = ak_kvf_tq_factor(ak_kvf_rd16(meta), d);
    uint32_t w = 0;
    int i = 0;
    for (; i + 8 <= d; i += 8) {   /* 8 codes = 3 bytes */
        const uint8_t *b = p + (size_t)(i / 8) * 3;
        uint32_t v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16;
        for (int k = 0; k < 8; k++) {
            w = w >> 3 | ((v >> (3 * k)) & 7) << 6;
            y[i + k] = ak_kvf_tcq3_table[w];
        }
    }
    for (; i < d; i++) {
        int bit = 3 * i;
        unsigned v = p[bit >> 3];
        if ((bit & 7) + 3 > 8) v |= (unsigned)p[(bit >> 3) + 1] << 8;
        w = w >> 3 | ((v >> (bit & 7)) & 7) << 6;
        y[i] = ak_kvf_tcq3_table[w];
    }
    for (i = 0; i < d; i++) y[i] *= fac;
}

void ak_kvf_tcq3_dot_c(const void *codes, size_t cstride, const void *meta, size_t mstride, int n, const float *q,
                       int d, float *out) {
    float y[AK_KVF_MAX_D];
    if (!valid_d(d)) return;
    for (int j = 0; j < n; j++) {
        tcq3_values((const uint8_t *)codes + (size_t)j * cstride, (const uint8_t *)meta + (size_t)j * mstride, d, y);
        float s[8] = { 0 };
        int i = 0;
        for (; i + 8 <= d; i += 8)
            for (int k = 0; k < 8; k++) s[k] += q[i + k] * y[i + k];
        for (; i < d; i++) s[0] += q[i] * y[i];
        out[j] = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    }
}

void ak_kvf_tcq3_axpy_c(const void *codes, size_t cstride, const void *meta, size_t mstride, int n, const float *w,
                        int d, float *acc) {
    float y[AK_KVF_MAX_D];
    if (!valid_d(d)) return;
    for (int j = 0; j < n; j++) {
        tcq3_values((const uint8_t *)codes + (size_t)j * cstride, (const uint8_t *)meta + (size_t)j * mstride, d, y);
        float wj = w[j];
        for (int i = 0; i < d; i++) acc[i] += wj * y[i];
    }
}

#define DESC_F32 "f32, 32 bits"
#define DESC_F16 "IEEE half, 16 bits"
#define DESC_BF16 "bfloat16, 16 bits"
#define DESC_Q8 "int8 symmetric, groups of 32, f16 scale: 8.5 bits"
#define DESC_Q4 "4-bit affine, groups of 32, f16 scale and min: 5 bits"
#define DESC_Q2 "2-bit affine, groups of 16, f16 scale and min: 4 bits"
#define DESC_TQ4 "Hadamard-rotated 4-bit Lloyd-Max codes, f16 norm: 4 + 16/d bits"
#define DESC_TQ3 "Hadamard-rotated 3-bit Lloyd-Max codes, f16 norm: 3 + 16/d bits"
#define DESC_TQ2 "Hadamard-rotated 2-bit Lloyd-Max codes, f16 norm: 2 + 16/d bits"
#define DESC_TCQ3 "Hadamard-rotated 3-bit trellis codes (Viterbi, 512-value table), f16 norm: 3 + 16/d bits"

/* dequant and dequant_t through the format's own axpy: vector j is axpy
 * with weight 1 into zeros (stored basis, the format's own arithmetic); the
 * scalar reference, and the SIMD entries without versions of their own. */
#define DQ_VIA_AXPY(NAME, AXPY)                                                                                \
    static void NAME##_dequant(const void *c, size_t cs, const void *m, size_t ms, int n, int d, float *out,   \
                               size_t os) {                                                                    \
        static const float one = 1.0f;                                                                         \
        for (int j = 0; j < n; j++) {                                                                          \
            float *o = out + (size_t)j * os;                                                                   \
            memset(o, 0, sizeof(float) * (size_t)d);                                                           \
            AXPY((const uint8_t *)c + (size_t)j * cs, cs, m ? (const uint8_t *)m + (size_t)j * ms : NULL, ms, 1, \
                 &one, d, o);                                                                                  \
        }                                                                                                      \
    }                                                                                                          \
    static void NAME##_dequant_t(const void *c, size_t cs, const void *m, size_t ms, int n, int d, float *out, \
                                 size_t os) {                                                                  \
        float y[AK_KVF_MAX_D];                                                                                 \
        if (!valid_d(d)) return;                                                                               \
        for (int j = 0; j < n; j++) {                                                                          \
            NAME##_dequant((const uint8_t *)c + (size_t)j * cs, cs, m ? (const uint8_t *)m + (size_t)j * ms : NULL, \
                           ms, 1, d, y, 0);                                                                    \
            for (int i = 0; i < d; i++) out[(size_t)i * os + j] = y[i];                                        \
        }                                                                                                      \
    }
DQ_VIA_AXPY(scalar_f32, axpy_f32)
DQ_VIA_AXPY(scalar_f16, axpy_f16)
DQ_VIA_AXPY(scalar_bf16, axpy_bf16)
DQ_VIA_AXPY(scalar_q8, axpy_q8)
DQ_VIA_AXPY(scalar_q4, axpy_q4)
DQ_VIA_AXPY(scalar_q2, axpy_q2)
DQ_VIA_AXPY(scalar_tq4, axpy_tq4)
DQ_VIA_AXPY(scalar_tq3, axpy_tq3)
DQ_VIA_AXPY(scalar_tq2, axpy_tq2)
DQ_VIA_AXPY(scalar_tcq3, axpy_tcq3)

#define ROW(F, DESC, ROT, DOT, AXPY, DQ, DQT) \
    { #F, DESC, ROT, vec_bytes_##F, quantize_##F, dequantize_##F, DOT, AXPY, DQ, DQT }
#define SCALAR_ROW(F, DESC, ROT) ROW(F, DESC, ROT, dot_##F, axpy_##F, scalar_##F##_dequant, scalar_##F##_dequant_t)

static const ak_kv_format_info scalar_table[AK_KV_NFORMATS] = {
    SCALAR_ROW(f32, DESC_F32, 0), SCALAR_ROW(f16, DESC_F16, 0), SCALAR_ROW(bf16, DESC_BF16, 0),
    SCALAR_ROW(q8, DESC_Q8, 0),   SCALAR_ROW(q4, DESC_Q4, 0),   SCALAR_ROW(q2, DESC_Q2, 0),
    SCALAR_ROW(tq4, DESC_TQ4, 1), SCALAR_ROW(tq3, DESC_TQ3, 1), SCALAR_ROW(tq2, DESC_TQ2, 1),
    SCALAR_ROW(tcq3, DESC_TCQ3, 1),
};

#ifdef AK_KVF_SIMD
#ifdef AK_KVF_SIMD_DEQUANT
#define SIMD_ROW(F, DESC, ROT) \
    ROW(F, DESC, ROT, ak_kvf_simd_dot_##F, ak_kvf_simd_axpy_##F, ak_kvf_simd_dequant_##F, ak_kvf_simd_dequant_t_##F)
DQ_VIA_AXPY(simd_tcq3, ak_kvf_simd_axpy_tcq3)
#define SIMD_ROW_TCQ3(DESC) \
    ROW(tcq3, DESC, 1, ak_kvf_simd_dot_tcq3, ak_kvf_simd_axpy_tcq3, simd_tcq3_dequant, simd_tcq3_dequant_t)
#else
#define DQ_SIMD(F) DQ_VIA_AXPY(simd_##F, ak_kvf_simd_axpy_##F)
DQ_SIMD(f32) DQ_SIMD(f16) DQ_SIMD(bf16) DQ_SIMD(q8) DQ_SIMD(q4)
DQ_SIMD(q2) DQ_SIMD(tq4) DQ_SIMD(tq3) DQ_SIMD(tq2) DQ_SIMD(tcq3)
#define SIMD_ROW(F, DESC, ROT) \
    ROW(F, DESC, ROT, ak_kvf_simd_dot_##F, ak_kvf_simd_axpy_##F, simd_##F##_dequant, simd_##F##_dequant_t)
#define SIMD_ROW_TCQ3(DESC) SIMD_ROW(tcq3, DESC, 1)
#endif
static const ak_kv_format_info simd_table[AK_KV_NFORMATS] = {
    SIMD_ROW(f32, DESC_F32, 0), SIMD_ROW(f16, DESC_F16, 0), SIMD_ROW(bf16, DESC_BF16, 0),
    SIMD_ROW(q8, DESC_Q8, 0),   SIMD_ROW(q4, DESC_Q4, 0),   SIMD_ROW(q2, DESC_Q2, 0),
    SIMD_ROW(tq4, DESC_TQ4, 1), SIMD_ROW(tq3, DESC_TQ3, 1), SIMD_ROW(tq2, DESC_TQ2, 1),
    SIMD_ROW_TCQ3(DESC_TCQ3),
};
#else
#define simd_table scalar_table
#endif

/* ------------------------------------------------------------------------ */
/* Public API                                                               */
/* ------------------------------------------------------------------------ */

const ak_kv_format_info *ak_kv_format_get(ak_kv_format f) {
    return (unsigned)f < AK_KV_NFORMATS ? &simd_table[f] : NULL;
}

const ak_kv_format_info *ak_kv_format_get_scalar(ak_kv_format f) {
    return (unsigned)f < AK_KV_NFORMATS ? &scalar_table[f] : NULL;
}

const char *ak_kv_format_backend(void) {
#ifdef AK_KVF_SIMD
    return ak_kvf_simd_name;
#else
    return "scalar";
#endif
}

int ak_kv_format_parse(const char *name, ak_kv_format *out) {
    if (!name) return -1;
    for (int f = 0; f < AK_KV_NFORMATS; f++)
        if (strcmp(name, scalar_table[f].name) == 0) {
            if (out) *out = (ak_kv_format)f;
            return 0;
        }
    return -1;
}

const char *ak_kv_format_names(void) { return "f32, f16, bf16, q8, q4, q2, tq4, tq3, tq2, tcq3"; }

int ak_kv_format_supports(ak_kv_format f, int d) { return (unsigned)f < AK_KV_NFORMATS && valid_d(d); }

int ak_kv_format_centers(ak_kv_format f) {
    return f == AK_KV_Q4 || f == AK_KV_Q2 || f == AK_KV_TQ4 || f == AK_KV_TQ3 || f == AK_KV_TQ2 || f == AK_KV_TCQ3;
}

double ak_kv_format_bits(ak_kv_format f, int d) {
    if (!ak_kv_format_supports(f, d)) return 0;
    return 8.0 * (double)vec_bytes(f, d) / d;
}

/* ------------------------------------------------------------------------ */
/* Lloyd-Max derivation                                                     */
/* ------------------------------------------------------------------------ */

static double npdf(double x) { return isinf(x) ? 0 : exp(-0.5 * x * x) / sqrt(2 * M_PI); }
static double x_npdf(double x) { return isinf(x) ? 0 : x * npdf(x); }

/* P(a < X < b) for X ~ N(0,1), from whichever tail keeps its precision. */
static double nprob(double a, double b) {
    const double r = M_SQRT1_2;
    if (a >= 0) return 0.5 * (erfc(a * r) - erfc(b * r));
    if (b <= 0) return 0.5 * (erfc(-b * r) - erfc(-a * r));
    return 1 - 0.5 * erfc(-a * r) - 0.5 * erfc(b * r);
}

/* The p-quantile of N(0,1), by bisection (used once, for a starting point). */
static double nquantile(double p) {
    double lo = -40, hi = 40;
    for (int i = 0; i < 200; i++) {
        double mid = 0.5 * (lo + hi);
        if (nprob(-INFINITY, mid) < p) lo = mid; else hi = mid;
    }
    return 0.5 * (lo + hi);
}

int ak_lloyd_max_derive(int bits, double *centroids, double *mse) {
    if (bits < 1 || bits > 8) return -1;
    int K = 1 << bits;
    double *c = centroids, t[257];
    /* Start at the optimal high-resolution density (quantiles of N(0,3)):
     * Lloyd's iteration converges linearly, and slowly for many levels. */
    for (int k = 0; k < K; k++) c[k] = sqrt(3.0) * nquantile((k + 0.5) / K);
    t[0] = -INFINITY;
    t[K] = INFINITY;
    for (int it = 0; it < 1000000; it++) {
        for (int k = 1; k < K; k++) t[k] = 0.5 * (c[k - 1] + c[k]);   /* nearest-centroid cells */
        double moved = 0;
        for (int k = 0; k < K; k++) {   /* each centroid to its cell's conditional mean */
            double nc = (npdf(t[k]) - npdf(t[k + 1])) / nprob(t[k], t[k + 1]);
            moved = fmax(moved, fabs(nc - c[k]));
            c[k] = nc;
        }
        if (moved < 1e-10) break;
    }
    for (int k = 1; k < K; k++) t[k] = 0.5 * (c[k - 1] + c[k]);
    /* E[(X - c)^2] over each cell, from int x^2 phi = P + a phi(a) - b phi(b)
     * and int x phi = phi(a) - phi(b). */
    double e = 0;
    for (int k = 0; k < K; k++) {
        double p = nprob(t[k], t[k + 1]);
        double m1 = npdf(t[k]) - npdf(t[k + 1]);
        double m2 = p + x_npdf(t[k]) - x_npdf(t[k + 1]);
        e += m2 - 2 * c[k] * m1 + c[k] * c[k] * p;
    }
    if (mse) *mse = e;
    return 0;
}
