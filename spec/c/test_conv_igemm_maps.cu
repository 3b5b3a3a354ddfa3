/*
 * test_conv_igemm_maps.cu — host emulation of the implicit-GEMM conv kernels
 * (cuda/nn_conv_igemm.cu): the tile loop runs on the CPU with the kernels own
 * Stage loaders (index maps, padding, stride, dilation, split-K chunks) and a
 * scalar product in place of the tensor cores, against a float64 direct
 * convolution.  Needs nvcc, not a GPU (runs in CI).  Tolerance (relative
 * Frobenius): 1e-5 for the f32 filter gradient (same bf16 operands, only the
 * f32 sum order differs), 4e-3 for the bf16 outputs of forward and
 * backward-data (one rounding, 2^-9 relative); a wrong index gives O(1).
 * Besides, every k tile the loaders stage is compared bit for bit with the
 * GEMM operands A(m, k) and B(k, n) taken from their definitions (ref_a,
 * ref_b): the loaders carry state from one k tile to the next (the filter
 * gradient's pixel, the tap-major tile's tap), so a slip shows there exactly.
 * The stride-phase backward-data kernel (igemm_dgrad_ph, nn_conv_igemm_ph.cuh)
 * is emulated the same way, group by group (its k-slices: ph_slice's
 * ranges, then the groups' sums added in group order) with its PhStage
 * loader reading the transposed weight wt that lucid_conv_igemm_wt_src
 * defines (checked element by element against w[co][ci][r][q]); its staged
 * A and B tiles are compared bit for bit with A and B from their
 * definitions, its output (its own epilogue) with the float64 reference.
 * Every strided case runs the backward-data with the switch on and off
 * (lucid_conv_igemm_set_dgrad_phase), and the plans of the six stride-2
 * 3x3 convs of YOLO11n-pose at batch 4, 640 (tile, k-slices, grid,
 * scratch) are checked against the values nn_conv_igemm.cu documents.
 */
#include "nn_conv_igemm.cu"
/* cuda/backend.cu (lucid_pdl_for_stream, used by lucid_launch in the included
 * launch code) is not linked into this host-only test; nothing is launched. */
int lucid_pdl_for_stream(cudaStream_t) { return 0; }
#include <vector>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
typedef __nv_bfloat16 T;
static float rb(float v){ return __bfloat162float(__float2bfloat16_rn(v)); }
static float frand(){ return (float)rand()/RAND_MAX*2-1; }
static unsigned short bits(T v){ unsigned short u; memcpy(&u,&v,2); return u; }
/* The GEMM operands by their definitions (nn_conv_igemm.cu's header comment;
 * tap-major slots: nn_conv_igemm_tile.cuh), 0 past kend, M, Nc and in the
 * padding; as staged (fwd/dgrad weights rounded to T). */
static int tm_map(const IgP& P,int k,int C,int& tap,int& c){ /* KT3 k -> tap, channel; false if padding */
  int kt=k/BK, s=k%BK, cpt=1<<P.lc, tg=kt/P.ct; tap=tg*(BK/cpt)+s/cpt; c=(kt%P.ct)*cpt+s%cpt; return tap<9 && c<C; }
template<int MODE,int KS>
static T ref_a(const IgP& P,const Phase& f,int m,int k,int kend){
  const T z=__float2bfloat16_rn(0.f);
  if(m>=P.M || k>=kend) return z;
  const int KH=kh_of<KS>(P), KW=kw_of<KS>(P), KK=KH*KW;
  if(MODE==IG_WGRAD){ int P2=P.Ho*P.Wo, im=k/P2; return ((const T*)P.a)[((size_t)im*P.Cout+m)*P2+k%P2]; }
  const float* w=(const float*)P.a; float v;
  if(KS==KT3 && MODE==IG_DGRAD_PH){ /* one tap per k tile: tap = kt/ct of the phase's nR x nQ */
    int kt=k/BK, tap=kt/P.ct, c=(kt%P.ct)*BK+k%BK; if(c>=P.Cout) return z;
    int r=f.a+P.sh*(tap/f.nQ), q=f.b+P.sw*(tap%f.nQ); v=w[((size_t)c*P.Cin+m)*9+r*3+q];
  } else if(KS==KT3){
    int tap,c; if(!tm_map(P,k,MODE==IG_FWD?P.Cin:P.Cout,tap,c)) return z;
    v= MODE==IG_FWD ? w[((size_t)m*P.Cin+c)*9+tap] : w[((size_t)c*P.Cin+m)*9+tap];
  } else if(MODE==IG_FWD) v=w[(size_t)m*P.K+k];
  else if(MODE==IG_DGRAD) v=w[((size_t)(k/KK)*P.Cin+m)*KK+k%KK];
  else { int nn=f.nR*f.nQ, co=k/nn, ri=k%nn/f.nQ, qi=k%nn%f.nQ; v=w[(((size_t)co*P.Cin+m)*KH+f.a+P.sh*ri)*KW+f.b+P.sw*qi]; }
  return __float2bfloat16_rn(v);
}
template<int MODE,int KS>
static T ref_b(const IgP& P,const Phase& f,int k,int n,int kend){ /* wgrad: k = pixel, n = column */
  const T z=__float2bfloat16_rn(0.f);
  if(k>=kend || n>=f.Nc) return z;
  const int KH=kh_of<KS>(P), KW=kw_of<KS>(P), KK=KH*KW;
  const T* src=(const T*)P.b;
  int c,r,q,img,ph,pw; /* channel, tap; pixel (fwd, wgrad: output; dgrad: input) */
  if(MODE==IG_WGRAD){
    if(KS==KT3){ int bx=n/BN, nl=n%BN, tg=bx/P.ct, tap=tg*(BN>>P.lc)+(nl>>P.lc); c=((bx%P.ct)<<P.lc)+(nl&((1<<P.lc)-1));
      if(tap>=9 || c>=P.Cin) return z; r=tap/3; q=tap%3; }
    else { c=n/KK; r=n%KK/KW; q=n%KK%KW; }
    int P2=P.Ho*P.Wo; img=k/P2; ph=k%P2/P.Wo; pw=k%P.Wo;
  } else {
    if(KS==KT3 && MODE==IG_DGRAD_PH){ int kt=k/BK, tap=kt/P.ct; c=(kt%P.ct)*BK+k%BK; if(c>=P.Cout) return z; r=f.a+P.sh*(tap/f.nQ); q=f.b+P.sw*(tap%f.nQ); }
    else if(KS==KT3){ int tap; if(!tm_map(P,k,MODE==IG_FWD?P.Cin:P.Cout,tap,c)) return z; r=tap/3; q=tap%3; }
    else if(MODE==IG_DGRAD_PH){ int nn=f.nR*f.nQ; c=k/nn; r=f.a+P.sh*(k%nn/f.nQ); q=f.b+P.sw*(k%nn%f.nQ); }
    else { c=k/KK; r=k%KK/KW; q=k%KK%KW; }
    if(MODE==IG_FWD){ int P2=P.Ho*P.Wo; img=n/P2; ph=n%P2/P.Wo; pw=n%P.Wo; }
    else if(MODE==IG_DGRAD){ int P2=P.H*P.W; img=n/P2; ph=n%P2/P.W; pw=n%P.W; }
    else { img=n/(f.Hp*f.Wp); ph=f.h0+P.sh*(n/f.Wp%f.Hp); pw=f.w0+P.sw*(n%f.Wp); }
  }
  if(MODE==IG_FWD || MODE==IG_WGRAD){ int hi=ph*P.sh-P.ph+r*P.dh, wi=pw*P.sw-P.pw+q*P.dw;
    if(hi<0||hi>=P.H||wi<0||wi>=P.W) return z; return src[(((size_t)img*P.Cin+c)*P.H+hi)*P.W+wi]; }
  int hn=ph+P.ph-r*P.dh, wn=pw+P.pw-q*P.dw;
  if(hn<0||wn<0||hn%P.sh||wn%P.sw||hn/P.sh>=P.Ho||wn/P.sw>=P.Wo) return z;
  return src[(((size_t)img*P.Cout+c)*P.Ho+hn/P.sh)*P.Wo+wn/P.sw];
}
static long staged_bad=0, staged_n=0;
// emulate a whole kernel grid on the host: out receives what the kernel writes
// (as float; wgrad partials per split)
template<int MODE,int KS>
static void emulate_t(const IgP& P, dim3 grid, std::vector<float>& out){
  std::vector<T> sA(BM*LDA), sB(SB_ELEMS); std::vector<float> sC(BM*LDC);
  for(unsigned bz=0;bz<grid.z;bz++) for(unsigned by=0;by<grid.y;by++) for(unsigned bx=0;bx<grid.x;bx++){
    int n0=bx*BN, m0=by*BM;
    Phase f; f.a=f.b=f.h0=f.w0=f.Hp=f.Wp=f.nR=f.nQ=0; f.Nc=P.Nc; f.K=P.K;
    if(MODE==IG_DGRAD_PH){ f=phase_of(P,bz); if(n0>=f.Nc) continue; }
    int kbeg,kend; k_range(P,f,MODE,bz,kbeg,kend);
    std::vector<Stage<T,MODE,KS>> st(NT);
    for(int t=0;t<NT;t++) st[t].init(P,f,n0,kbeg,t);
    std::fill(sC.begin(),sC.end(),0.f);
    for(int k0=kbeg;k0<kend;k0+=BK){
      for(int t=0;t<NT;t++){ st[t].load(P,f,m0,n0,k0,kend,t); st[t].store(sA.data(),sB.data(),t);}
      for(int r=0;r<BM;r++) for(int kk=0;kk<BK;kk++,staged_n++) staged_bad+= bits(sA[r*LDA+kk])!=bits(ref_a<MODE,KS>(P,f,m0+r,k0+kk,kend));
      for(int kk=0;kk<BK;kk++) for(int c=0;c<BN;c++,staged_n++)
        staged_bad+= bits(MODE==IG_WGRAD? sB[c*LDBC+kk] : sB[kk*LDBR+c])!=bits(ref_b<MODE,KS>(P,f,k0+kk,n0+c,kend));
      for(int r=0;r<BM;r++) for(int c=0;c<BN;c++){ float a=0; for(int kk=0;kk<BK;kk++){
        float av=to_f(sA[r*LDA+kk]); float bv= MODE==IG_WGRAD? to_f(sB[c*LDBC+kk]) : to_f(sB[kk*LDBR+c]); a+=av*bv;} sC[r*LDC+c]+=a; }
    }
    /* the kernel's own epilogue, thread by thread; fwd/dgrad write T */
    std::vector<T> tout;
    IgP Q=P;
    const bool tpath = MODE!=IG_WGRAD && P.direct; /* else f32 (partials) */
    if(tpath){ tout.assign(out.size(), __float2bfloat16_rn(NAN)); Q.out=tout.data(); } else Q.out=out.data();
    for(int t=0;t<NT;t++) epilogue<T,MODE>(Q,f,m0,n0,bz,t,sC.data());
    if(tpath) for(size_t i=0;i<out.size();i++){ float v=__bfloat162float(tout[i]); if(v==v) out[i]=v; }
  }
}
/* igemm_dgrad_ph: A and B of the phase GEMM by definition (nn_conv_igemm_ph.cuh),
 * A from the f32 master weight (so the wt map is checked too), 0 for co >= Cout,
 * ci >= Cin and (B) past the phase's pixels or outside dy */
static bool ph_k(const IgP& P,const Phase& f,int k,int& co,int& r,int& q){
  int kt=k/BK, tp=kt/P.ct; co=(kt%P.ct)*BK+k%BK; r=f.a+P.sh*(tp/f.nQ); q=f.b+P.sw*(tp%f.nQ); return co<P.Cout; }
static T ref_a_ph(const IgP& P,const Phase& f,const float* w,int ci,int k){
  int co,r,q; if(ci>=P.Cin || !ph_k(P,f,k,co,r,q)) return __float2bfloat16_rn(0.f);
  return __float2bfloat16_rn(w[(((size_t)co*P.Cin+ci)*P.kh+r)*P.kw+q]); }
static T ref_b_ph(const IgP& P,const Phase& f,int k,int n){
  const T z=__float2bfloat16_rn(0.f); int co,r,q; if(n>=f.Nc || !ph_k(P,f,k,co,r,q)) return z;
  int img=n/(f.Hp*f.Wp), h=f.h0+P.sh*(n/f.Wp%f.Hp), w=f.w0+P.sw*(n%f.Wp), hn=h+P.ph-r, wn=w+P.pw-q;
  if(hn<0||wn<0||hn%P.sh||wn%P.sw||hn/P.sh>=P.Ho||wn/P.sw>=P.Wo) return z;
  return ((const T*)P.b)[(((size_t)img*P.Cout+co)*P.Ho+hn/P.sh)*P.Wo+wn/P.sw]; }
template<int BM_>
static void emulate_ph_t(const IgLaunch& L, const float* w, const T* wt, std::vector<float>& out){
  typedef PhCfg<BM_> C; const IgP& P=L.P; const int KSn=L.ks, nthr=NT*KSn;
  std::vector<T> sA(BK*C::LA), sB(BK*C::LB); std::vector<float> sC(C::TM*C::LC), part(C::TM*C::TN);
  std::vector<T> tout(out.size(), __float2bfloat16_rn(NAN)); IgP Q=P; Q.out=tout.data();
  for(unsigned bz=0;bz<L.grid.z;bz++) for(unsigned by=0;by<L.grid.y;by++) for(unsigned bx=0;bx<L.grid.x;bx++){
    const int n0=bx*C::TN, m0=by*C::TM; const Phase f=phase_of(P,bz); if(n0>=f.Nc) continue;
    for(int g=0;g<KSn;g++){
      int kb,ke; ph_slice(f.K/BK,KSn,g,kb,ke);
      std::vector<PhStage<T,BM_>> st(NT); std::fill(part.begin(),part.end(),0.f);
      if(kb<ke) for(int t=0;t<NT;t++) st[t].init(P,f,n0,kb,t);
      for(int kt=kb;kt<ke;kt++){
        std::fill(sA.begin(),sA.end(),__float2bfloat16_rn(NAN)); /* every element must be staged */
        for(int t=0;t<NT;t++){ st[t].load(P,f,wt,m0,t); st[t].store(sA.data(),sB.data(),t); }
        for(int m=0;m<C::TM;m++) for(int kk=0;kk<BK;kk++,staged_n++) staged_bad+= bits(sA[kk*C::LA+m])!=bits(ref_a_ph(P,f,w,m0+m,kt*BK+kk));
        for(int kk=0;kk<BK;kk++) for(int c=0;c<C::TN;c++,staged_n++) staged_bad+= bits(sB[kk*C::LB+c])!=bits(ref_b_ph(P,f,kt*BK+kk,n0+c));
        for(int r=0;r<C::TM;r++) for(int c=0;c<C::TN;c++){ float a=0; for(int kk=0;kk<BK;kk++) a+=to_f(sA[kk*C::LA+r])*to_f(sB[kk*C::LB+c]); part[r*C::TN+c]+=a; }
      }
      for(int r=0;r<C::TM;r++) for(int c=0;c<C::TN;c++) sC[r*C::LC+c]= g==0 ? part[r*C::TN+c] : sC[r*C::LC+c]+part[r*C::TN+c];
    }
    for(int t=0;t<nthr;t++) ph_epilogue<T,BM_>(Q,f,m0,n0,t,nthr,sC.data());
  }
  for(size_t i=0;i<out.size();i++){ float v=__bfloat162float(tout[i]); if(v==v) out[i]=v; }
}
/* the transposed weight as igemm_wt_cast writes it, checked against its definition */
static std::vector<T> make_wt(const std::vector<float>& w,int Cin,int Cout,int kh,int kw){
  const int KK=kh*kw; std::vector<T> wt((size_t)Cout*Cin*KK); long bad=0;
  for(size_t i=0;i<wt.size();i++) wt[i]=__float2bfloat16_rn(w[lucid_conv_igemm_wt_src((int64_t)i,Cin,Cout,KK)]);
  for(int r=0;r<kh;r++) for(int q=0;q<kw;q++) for(int co=0;co<Cout;co++) for(int ci=0;ci<Cin;ci++)
    bad+= bits(wt[(((size_t)(r*kw+q))*Cout+co)*Cin+ci])!=bits(__float2bfloat16_rn(w[(((size_t)co*Cin+ci)*kh+r)*kw+q]));
  staged_bad+=bad; staged_n+=(long)wt.size();
  return wt;
}
template<int MODE>
static void emulate_m(const IgLaunch& L, std::vector<float>& out){
  switch(L.ks){ case KV1: emulate_t<MODE,KV1>(L.P,L.grid,out); break; case 1: emulate_t<MODE,1>(L.P,L.grid,out); break;
    case 3: emulate_t<MODE,3>(L.P,L.grid,out); break; case KT3: emulate_t<MODE,KT3>(L.P,L.grid,out); break; default: emulate_t<MODE,0>(L.P,L.grid,out); }
}
static void emulate(const IgLaunch& L, std::vector<float>& out){
  switch(L.mode){ case IG_FWD: emulate_m<IG_FWD>(L,out); break; case IG_DGRAD: emulate_m<IG_DGRAD>(L,out); break;
    case IG_DGRAD_PH: emulate_m<IG_DGRAD_PH>(L,out); break; default: emulate_m<IG_WGRAD>(L,out); }
}
static const char* variant(const IgLaunch& L){
  static char b[64];
  if(L.mode==IG_DGRAD_PH2){ snprintf(b,64,"phase kernel %dx%d tiles, %d k-slices",L.bm,L.bm==16?PhCfg<16>::TN:PhCfg<64>::TN,L.ks); return b; }
  snprintf(b,64,"%s%s", L.mode==IG_DGRAD_PH?"phases ":"", L.ks==KV1?"vec1x1":L.ks==1?"k1":L.ks==3?"k3":L.ks==KT3?"tap-major k3":"generic"); return b;
}
static int fails=0;
static void check(const char*name,const std::vector<float>&a,const std::vector<double>&r,double tol=1e-5){
  double num=0,den=0; for(size_t i=0;i<a.size();i++){double d=a[i]-r[i]; num+=d*d; den+=r[i]*r[i];}
  double e=sqrt(num/(den+1e-30)); long bad=staged_bad, n=staged_n; staged_bad=staged_n=0;
  if(bad){ printf("not ok %s: %ld of %ld staged operand elements differ from A/B\n",name,bad,n); fails++; }
  else if(e<tol) printf("ok %s (rel %.2e)\n",name,e); else {printf("not ok %s: rel err %.2e > %.0e\n",name,e,tol); fails++;}
}
/* only_dgrad: the backward-data passes alone (large shapes) */
static void run(int N,int Cin,int H,int W,int Cout,int kh,int kw,int s,int p,int d,bool only_dgrad=false){
  lucid_igemm_geom g; g.N=N;g.Cin=Cin;g.H=H;g.W=W;g.Cout=Cout;g.kh=kh;g.kw=kw;g.sh=g.sw=s;g.ph=g.pw=p;g.dh=g.dw=d;
  g.Ho=(H+2*p-d*(kh-1)-1)/s+1; g.Wo=(W+2*p-d*(kw-1)-1)/s+1;
  int Ho=g.Ho,Wo=g.Wo; size_t nx=(size_t)N*Cin*H*W, ny=(size_t)N*Cout*Ho*Wo, nw=(size_t)Cout*Cin*kh*kw;
  std::vector<T> x(nx), dy(ny); std::vector<float> xf(nx), dyf(ny), w(nw), wr(nw), b(Cout);
  for(size_t i=0;i<nx;i++){xf[i]=rb(frand()); x[i]=__float2bfloat16_rn(xf[i]);}
  for(size_t i=0;i<ny;i++){dyf[i]=rb(frand()); dy[i]=__float2bfloat16_rn(dyf[i]);}
  for(size_t i=0;i<nw;i++){w[i]=frand(); wr[i]=rb(w[i]);} for(int i=0;i<Cout;i++) b[i]=frand();
  std::vector<double> ry(ny,0), rdx(nx,0), rdw(nw,0);
  for(int n=0;n<N;n++) for(int co=0;co<Cout;co++) for(int ho=0;ho<Ho;ho++) for(int wo=0;wo<Wo;wo++){
    for(int ci=0;ci<Cin;ci++) for(int r=0;r<kh;r++) for(int q=0;q<kw;q++){ int hi=ho*s-p+r*d, wi=wo*s-p+q*d; if(hi<0||hi>=H||wi<0||wi>=W) continue;
      size_t xi=(((size_t)n*Cin+ci)*H+hi)*W+wi, wi_=(((size_t)co*Cin+ci)*kh+r)*kw+q, yi=(((size_t)n*Cout+co)*Ho+ho)*Wo+wo;
      ry[yi]+= (double)wr[wi_]*xf[xi]; rdx[xi]+=(double)wr[wi_]*dyf[yi]; rdw[wi_]+=(double)dyf[yi]*xf[xi]; } }
  for(int n=0;n<N;n++) for(int co=0;co<Cout;co++) for(int i=0;i<Ho*Wo;i++) ry[((size_t)n*Cout+co)*Ho*Wo+i]+=b[co];
  char nm[160];
  const bool strided = s>1;
  for(int pass=only_dgrad?1:0;pass<(strided?3:2);pass++){
    /* pass 2: the strided backward-data again with the phase kernel's switch off */
    if(pass==2) lucid_conv_igemm_set_dgrad_phase(0);
    IgLaunch L= pass==0 ? plan_forward(&g,x.data(),w.data(),b.data(),nullptr) : plan_backward_data(&g,dy.data(),w.data(),nullptr,0.f);
    size_t n= pass==0 ? ny : nx; const std::vector<double>& ref= pass==0 ? ry : rdx;
    std::vector<float> out(n,NAN); double tol=4e-3;
    if(L.mode==IG_DGRAD_PH2){
      if(lucid_conv_igemm_scratch(&g,1)!=(size_t)(nw*2+255)/256*256 || lucid_conv_igemm_dgrad_wt_elems(&g)!=(int64_t)nw){ printf("not ok phase kernel scratch / wt sizes\n"); fails++; }
      std::vector<T> wt=make_wt(w,Cin,Cout,kh,kw);
      if(L.bm==16) emulate_ph_t<16>(L,w.data(),wt.data(),out); else emulate_ph_t<64>(L,w.data(),wt.data(),out);
    } else if(pass==1 && strided && d==1 && Cin%8==0 && lucid_conv_igemm_dgrad_phase()){ printf("not ok dgrad N%d %d>%d s%d: the phase kernel did not take it\n",N,Cin,Cout,s); fails++; }
    else if(pass==2 && (lucid_conv_igemm_dgrad_wt_elems(&g)!=0 || L.mode==IG_DGRAD_PH2)){ printf("not ok switch off: wt still read\n"); fails++; }
    else if(!L.P.direct){ /* split-K: partials in output order, folded here as igemm_reduce_out does */
      if((size_t)L.P.part_n!=n || lucid_conv_igemm_scratch(&g,pass)!=(size_t)L.splits*n*sizeof(float)){ printf("not ok split-K sizes\n"); fails++; }
      std::vector<float> part((size_t)L.splits*n,NAN); emulate(L,part);
      int plane= pass==0 ? Ho*Wo : H*W, M= pass==0 ? Cout : Cin;
      for(size_t i=0;i<n;i++){ float v=part[i]; for(int k=1;k<L.splits;k++) v+=part[k*n+i]; if(pass==0) v+=b[(i/plane)%M]; out[i]=v; }
      tol=1e-5;
    } else emulate(L,out);
    snprintf(nm,160,"%s N%d %d>%d %dx%d k%dx%d s%d p%d d%d splits %d [%s]",pass==0?"fwd":pass==1?"dgrad":"dgrad (phase switch off)",N,Cin,Cout,H,W,kh,kw,s,p,d,L.splits,variant(L));
    check(nm,out,ref,tol);
    if(pass==2) lucid_conv_igemm_set_dgrad_phase(-1);
  }
  if(!only_dgrad){ IgLaunch L=plan_backward_filter(&g,x.data(),dy.data(),nullptr,0.f,nullptr); int splits=L.splits;
    std::vector<float> part((size_t)splits*nw,NAN); emulate(L,part);
    std::vector<float> out(nw); for(size_t i=0;i<nw;i++){float sum=part[i]; for(int k=1;k<splits;k++) sum+=part[k*nw+i]; out[i]=sum;}
    snprintf(nm,160,"wgrad N%d %d>%d %dx%d k%dx%d s%d p%d d%d splits %d [%s]",N,Cin,Cout,H,W,kh,kw,s,p,d,splits,variant(L)); check(nm,out,rdw);}
}
/* The plan of the phase kernel for a 3x3 stride-2 pad-1 backward-data:
 * tile rows, k-slices, grid (nn_conv_igemm.cu ph_plan's rule) */
static void plan_check(const char* tag,int N,int Cin,int H,int W,int Cout,int bm,int ks,int gx,int gy){
  lucid_igemm_geom g; g.N=N;g.Cin=Cin;g.H=H;g.W=W;g.Cout=Cout;g.kh=g.kw=3;g.sh=g.sw=2;g.ph=g.pw=1;g.dh=g.dw=1;
  g.Ho=(H-1)/2+1; g.Wo=(W-1)/2+1;
  IgLaunch L=plan_backward_data(&g,nullptr,nullptr,nullptr,0.f);
  bool good= L.mode==IG_DGRAD_PH2 && L.bm==bm && L.ks==ks && (int)L.grid.x==gx && (int)L.grid.y==gy && L.grid.z==4 &&
             lucid_conv_igemm_scratch(&g,1)==((size_t)Cout*Cin*9*2+255)/256*256;
  if(good) printf("ok plan %s: %dx%d tiles, %d k-slices, grid %u.%u.%u\n",tag,L.bm,L.bm==16?128:64,L.ks,L.grid.x,L.grid.y,L.grid.z);
  else { printf("not ok plan %s: mode %d tiles %d k-slices %d grid %u.%u.%u (expected %d, %d, %d.%d.4)\n",tag,L.mode,L.bm,L.ks,L.grid.x,L.grid.y,L.grid.z,bm,ks,gx,gy); fails++; }
  lucid_conv_igemm_set_dgrad_phase(0);
  L=plan_backward_data(&g,nullptr,nullptr,nullptr,0.f);
  good= L.mode==IG_DGRAD_PH && L.ks==KT3 && lucid_conv_igemm_scratch(&g,1)==0 && lucid_conv_igemm_dgrad_wt_elems(&g)==0;
  if(good) printf("ok plan %s, switch off: igemm_nchw's phase form, no scratch\n",tag);
  else { printf("not ok plan %s, switch off: mode %d ks %d\n",tag,L.mode,L.ks); fails++; }
  lucid_conv_igemm_set_dgrad_phase(-1);
}
int main(){
  if(!lucid_conv_igemm_dgrad_phase()){ printf("not ok LUCID_DGRAD_PHASE=0 in the environment: unset it for this test\n"); return 1; }
  /* the six stride-2 3x3 convs of YOLO11n-pose at batch 4, 640 (model.1, 3, 5, 7, 17, 20) */
  plan_check("16>32 320x320",4,16,320,320,32,16,1,800,1);
  plan_check("64>64 160x160",4,64,160,160,64,64,1,400,1);
  plan_check("128>128 80x80",4,128,80,80,128,64,2,100,2);
  plan_check("128>256 40x40",4,128,40,40,256,64,4,25,2);
  plan_check("64>64 80x80",4,64,80,80,64,64,2,100,1);
  plan_check("128>128 40x40",4,128,40,40,128,64,4,25,2);
  /* their backward-data on the phase kernel, channel counts kept, planes
   * scaled down (odd sizes too), the 20x20 one at full size; a 16-channel
   * input with 2 and 4 k-slices (Cout 64, 128); Cin 8; stride 3; 1x1 and
   * 2x2 stride 2 (phases without taps); pad 0 */
  run(1,16,20,18,32,3,3,2,1,1,true); run(2,16,21,19,32,3,3,2,1,1,true);
  run(1,64,18,18,64,3,3,2,1,1,true); run(1,128,12,10,128,3,3,2,1,1,true);
  run(1,128,10,10,256,3,3,2,1,1,true); run(2,64,16,16,64,3,3,2,1,1,true);
  run(4,128,40,40,128,3,3,2,1,1,true); run(1,128,40,40,256,3,3,2,1,1,true);
  run(1,16,9,11,64,3,3,2,1,1,true); run(1,16,7,8,128,3,3,2,1,1,true); run(2,8,9,7,24,3,3,2,1,1);
  run(1,24,10,8,20,3,3,3,1,1); run(2,32,9,9,16,1,1,2,0,1); run(1,16,10,11,12,2,2,2,0,1);
  run(1,40,11,9,36,3,3,2,0,1);
  run(2,8,13,11,16,3,3,1,1,1); run(2,16,17,15,8,3,3,2,1,1); run(3,32,9,10,24,1,1,1,0,1); run(2,8,12,13,8,3,3,1,2,2);
  run(1,3,64,64,16,3,3,2,1,1); run(2,51,20,20,51,3,3,1,1,1); run(2,70,9,9,33,1,1,2,0,1); run(1,5,11,9,7,5,5,1,2,1);
  run(4,32,40,40,32,3,3,1,1,1); run(2,64,23,23,80,3,3,2,1,1); run(1,3,7,9,5,2,3,1,0,1);
  /* vectorised 1x1 (H*W % 8 == 0, aligned) and stride phases (s2 and s3, odd sizes, 1x1 s2, 2x2 s2) */
  run(2,24,8,10,40,1,1,1,0,1); run(4,128,20,20,64,1,1,1,0,1); run(1,70,4,6,9,1,1,1,0,1);
  run(2,16,16,16,32,3,3,2,1,1); run(1,8,15,13,6,3,3,3,1,1); run(2,12,9,9,10,1,1,2,0,1); run(1,6,10,11,4,2,2,2,0,1);
  run(1,5,12,12,7,5,5,2,2,1);
  /* split-K forward / backward-data (grids under 132 blocks) */
  run(4,64,20,20,64,3,3,1,1,1); run(4,256,20,20,64,3,3,1,1,1); run(4,128,20,20,256,1,1,1,0,1); run(2,51,13,11,33,3,3,1,1,1);
  /* tap-major 3x3 (KT3): channel tails (70 = 2 tiles + 6, 51, 20, 17), stride 2
   * and 3 phases, dilation 2, filter gradient with Cin >= 48 (one and two
   * column tiles per tap) */
  run(1,70,9,7,20,3,3,2,1,1); run(1,48,12,10,17,3,3,1,2,2); run(1,20,15,13,24,3,3,3,1,1);
  run(2,96,6,5,70,3,3,1,1,1); run(1,130,5,6,40,3,3,2,1,1);
  /* tap-major with few channels (filter gradient: slots of 4, 8, 16, 32) */
  run(2,3,17,15,16,3,3,2,1,1); run(1,5,9,9,6,3,3,1,1,1); run(1,16,10,12,8,3,3,1,1,1); run(1,32,9,7,12,3,3,2,1,1);
  /* tap-major forward / backward-data with few channels (slots of 4, 8, 16: 8, 4, 2 taps per k tile), dilation */
  run(1,3,12,11,8,3,3,1,1,1); run(1,7,10,9,3,3,3,1,2,2); run(1,12,8,8,5,3,3,2,1,1);
  /* carried loader state (the filter gradient's pixel, the tap-major tile's
   * tap): splits that start mid-row and mid-image, Wo < 32 and Ho*Wo not a
   * multiple of 32 (k tiles across rows and images), Wo = 1 and Ho*Wo < 32
   * (several images per k tile); one tap per column tile (Cin 40, 64, 100:
   * 1 and 2 channel tiles) and few channels (12, 8, 16), stride 2; 1x1
   * vectors with planes of 8 and 24; generic 5x5 and scalar 1x1 */
  run(3,40,9,14,24,3,3,2,1,1); run(4,12,10,10,8,3,3,2,1,1); run(2,64,20,20,16,3,3,1,1,1);
  run(2,100,11,9,40,3,3,1,1,1); run(5,8,7,1,6,3,3,1,1,1); run(40,16,1,1,8,3,3,1,1,1);
  run(9,16,2,4,24,1,1,1,0,1); run(3,8,4,6,16,1,1,1,0,1); run(3,4,6,5,6,5,5,1,2,1);
  run(6,10,3,5,12,1,1,1,0,1);
  return fails != 0;
}
